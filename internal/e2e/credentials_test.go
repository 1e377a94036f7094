//go:build integration

package e2e_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/agent"
	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/session"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// credentialUpstream is an HTTPS server on 127.0.0.1 (Go's test
// certificate, for 127.0.0.1 but not for localhost) that a server reaches
// through an egress credential rule named "upstream" for the paths under
// /allowed, whose secret the sandbox must never learn.
type credentialUpstream struct {
	srv    *httptest.Server
	port   string
	secret string
}

// newCredentialUpstream starts h on an upstream with a fresh secret.
func newCredentialUpstream(t *testing.T, h func(u *credentialUpstream, w http.ResponseWriter, r *http.Request)) *credentialUpstream {
	t.Helper()
	b := make([]byte, 12)
	rand.Read(b)
	u := &credentialUpstream{secret: "corral-credential-" + hex.EncodeToString(b)}
	u.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h(u, w, r) }))
	t.Cleanup(u.srv.Close)
	_, u.port, _ = net.SplitHostPort(u.srv.Listener.Addr().String())
	return u
}

// ruled is the upstream's URL under the name its rule has; unruled, under
// another name (no rule).
func (u *credentialUpstream) ruled() string   { return "https://127.0.0.1:" + u.port }
func (u *credentialUpstream) unruled() string { return "https://localhost:" + u.port }

// configure allows both names, trusts the upstream's certificate, and
// gives the rule: scheme and username as egress.credentials take them.
func (u *credentialUpstream) configure(tb testing.TB, c *config.Config, scheme, username string, onRequest bool) {
	tb.Helper()
	dir := tb.TempDir()
	ca := filepath.Join(dir, "upstream-ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: u.srv.Certificate().Raw}), 0o644); err != nil {
		tb.Fatal(err)
	}
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte(u.secret+"\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	c.Egress.Mode = "allowlist"
	c.Egress.Allow = append(c.Egress.Allow, "127.0.0.1:"+u.port, "localhost:"+u.port)
	c.Egress.UpstreamCAFile = ca
	c.Egress.Credentials = append(c.Egress.Credentials, config.EgressCredential{
		Name: "upstream", Host: "127.0.0.1:" + u.port, PathPrefix: "/allowed",
		Scheme: scheme, Username: username, SecretFile: secret, OnRequest: onRequest, PlaceholderEnv: "UPSTREAM_TOKEN",
	})
}

// probeUpstream answers as the escape probe's credential checks expect
// (credentialChecks in the probe).
func probeUpstream(u *credentialUpstream, w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/allowed/check":
		yes := "no"
		if r.Header.Get("Authorization") == "Bearer "+u.secret {
			yes = "yes"
		}
		fmt.Fprintf(w, "credential: %s\n", yes)
	case "/allowed/redirect":
		http.Redirect(w, r, u.unruled()+"/echo", http.StatusFound)
	default:
		fmt.Fprintf(w, "authorization: %s\n", r.Header.Get("Authorization"))
	}
}

// assertSecretAbsent fails if secret (a key, a token) is in any file of
// the task directory, which must have some, in any event of the server or
// in the task's logs.
func assertSecretAbsent(t *testing.T, s *server, id, secret string) {
	t.Helper()
	dir := filepath.Join(s.data, "tasks", id)
	files := 0
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		files++
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), secret) {
			t.Errorf("the secret is in %s", strings.TrimPrefix(p, s.data))
		}
		return nil
	})
	if files == 0 {
		t.Errorf("no files in %s", dir)
	}
	n := 0
	err := s.client.Events(context.Background(), service.EventsRequest{}, func(e eventstore.Event) error {
		n++
		if strings.Contains(string(e.Data), secret) {
			t.Errorf("the secret is in event %s (%s)", e.ID, e.Type)
		}
		return nil
	})
	if err != nil || n == 0 {
		t.Errorf("events: %d, %v", n, err)
	}
	for _, stream := range []string{"", "?stream=stderr"} {
		if _, body := s.do(t, "GET", "/api/tasks/"+id+"/logs"+stream, "", nil); strings.Contains(body, secret) {
			t.Errorf("the secret is in the logs%s", stream)
		}
	}
}

// TestGitThroughACredentialRule: the real git in a sandbox clones a
// repository from an HTTPS host that wants a token, which a credential
// rule given on request adds at the egress: the task that asks for the
// rule clones, one that does not is refused by the host. While the
// clone's authorized request is in flight, and after, the token is in no
// process of the sandbox, no file of the task, no event and no log; the
// requests are in the task's events with their paths.
func TestGitThroughACredentialRule(t *testing.T) {
	for _, rt := range []string{"local", "gvisor", "kubernetes"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "gvisor" {
				testenv.RequireRunsc(t)
			}
			t.Parallel()
			// sandboxOf names what of a task's sandbox its processes'
			// cgroup paths hold.
			sandboxOf := func(id string) string { return id }
			root := t.TempDir()
			mustGitRepo(t, filepath.Join(root, "allowed", "repo.git"), "hello from the ruled host\n")
			backend := &cgi.Handler{Path: "/usr/lib/git-core/git-http-backend", Root: "/",
				Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}}
			var (
				mu       sync.Mutex
				taskID   string
				inFlight []string
				scanned  bool
			)
			up := newCredentialUpstream(t, func(u *credentialUpstream, w http.ResponseWriter, r *http.Request) {
				want := "Basic " + base64.StdEncoding.EncodeToString([]byte("x-access-token:"+u.secret))
				if r.Header.Get("Authorization") != want {
					w.Header().Set("WWW-Authenticate", `Basic realm="git"`)
					http.Error(w, "who are you?", http.StatusUnauthorized)
					return
				}
				mu.Lock()
				if !scanned && taskID != "" {
					inFlight, scanned = keyScan(t, sandboxOf(taskID), u.secret), true
				}
				mu.Unlock()
				backend.ServeHTTP(w, r)
			})
			s := MustStart(t, func(c *config.Config) {
				c.Runtime = rt
				c.Local.WarmPool = 0 // a sandbox named after its task: its cgroups are found by the name
				up.configure(t, c, config.SchemeBasic, "x-access-token", true)
				if rt == "kubernetes" {
					sandboxOf = onClaudePods(t, c)
				}
			})
			clone := []string{"sh", "-c", "echo ${UPSTREAM_TOKEN:-unset} > output/env; GIT_TERMINAL_PROMPT=0 git clone -q " + up.ruled() + "/allowed/repo.git /tmp/r && cp /tmp/r/README output/README"}

			// Without the rule: the host refuses.
			refused := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "clone without", Agent: "command", Command: clone, Network: "allowlist"})
			if res := s.wait(t, refused.ID, 2*time.Minute); res.Status != task.Failed {
				t.Fatalf("a clone without the rule: %s, want failed (the host wants a token)", res.Status)
			}
			if b, _ := os.ReadFile(filepath.Join(s.data, "tasks", refused.ID, "output", "env")); string(b) != "unset\n" {
				t.Errorf("a task without the rule has its placeholder variable: %q", b)
			}

			tk := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "clone with", Agent: "command", Command: clone, Network: "allowlist", Credentials: []string{"upstream"}})
			mu.Lock()
			taskID = tk.ID
			mu.Unlock()
			s.waitSuccess(t, tk.ID, 2*time.Minute, "README")
			if b, _ := os.ReadFile(filepath.Join(s.data, "tasks", tk.ID, "output", "README")); string(b) != "hello from the ruled host\n" {
				t.Errorf("cloned README: %q", b)
			}
			if b, _ := os.ReadFile(filepath.Join(s.data, "tasks", tk.ID, "output", "env")); string(b) != agent.KeyPlaceholder+"\n" {
				t.Errorf("the rule's placeholder variable: %q, want %q", b, agent.KeyPlaceholder)
			}
			mu.Lock()
			if !scanned {
				t.Error("no authorized request came while the task ran: nothing was scanned")
			}
			if len(inFlight) > 0 {
				t.Errorf("while its request was in flight the token was in %v", inFlight)
			}
			mu.Unlock()
			assertSecretAbsent(t, s, tk.ID, up.secret)
			evs := egressEvents(t, s.client, tk.ID, func(evs []task.EgressConnection) bool {
				for _, e := range evs {
					if e.Path == "/allowed/repo.git/info/refs" && e.Credential && e.Method == "GET" && e.Status == 200 {
						return true
					}
				}
				return false
			})
			for _, e := range evs {
				if e.Host == "127.0.0.1" && !e.Credential {
					t.Errorf("a request of the clone went without the credential: %+v", e)
				}
			}
			raw, _ := json.Marshal(evs)
			if strings.Contains(string(raw), "service=") {
				t.Errorf("a recorded path holds a query: %s", raw)
			}
		})
	}
}

// TestCredentialsRefusedAtSpawn: a task may name only rules given on
// request, and only with a network.
func TestCredentialsRefusedAtSpawn(t *testing.T) {
	up := newCredentialUpstream(t, probeUpstream)
	s := MustStart(t, func(c *config.Config) { up.configure(t, c, config.SchemeBearer, "", true) })
	for _, c := range []struct {
		req  service.SpawnRequest
		want string
	}{
		{service.SpawnRequest{Credentials: []string{"nope"}, Network: "allowlist"}, `is not a credential rule given on request (upstream are)`},
		{service.SpawnRequest{Credentials: []string{"upstream"}, Network: "none"}, "not none"},
	} {
		c.req.TaskDescription, c.req.Agent, c.req.Command = "x", "command", []string{"true"}
		b, _ := json.Marshal(c.req)
		status, body := s.do(t, "POST", "/api/tasks", "application/json", strings.NewReader(string(b)))
		if status != http.StatusBadRequest || !strings.Contains(body, c.want) {
			t.Errorf("%+v: %d %s; want 400 saying %q", c.req.Credentials, status, body, c.want)
		}
	}
}

// mustGitRepo makes a bare repository at dir with one commit holding
// README.
func mustGitRepo(t *testing.T, dir, readme string) {
	t.Helper()
	work := t.TempDir()
	git := func(dir string, args ...string) {
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "init.defaultBranch=main"}, args...)...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	git(work, "init", "-q")
	if err := os.WriteFile(filepath.Join(work, "README"), []byte(readme), 0o644); err != nil {
		t.Fatal(err)
	}
	git(work, "add", "README")
	git(work, "commit", "-qm", "first")
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	git(filepath.Dir(dir), "clone", "-q", "--bare", work, dir)
}

// TestSessionThroughACredentialRule: a session's commands get the rules
// given to every task and session: git clones through one, and the token
// is in none of the session's events.
func TestSessionThroughACredentialRule(t *testing.T) {
	root := t.TempDir()
	mustGitRepo(t, filepath.Join(root, "allowed", "repo.git"), "hello to a session\n")
	backend := &cgi.Handler{Path: "/usr/lib/git-core/git-http-backend", Root: "/",
		Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"}}
	up := newCredentialUpstream(t, func(u *credentialUpstream, w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+u.secret {
			http.Error(w, "who are you?", http.StatusUnauthorized)
			return
		}
		backend.ServeHTTP(w, r)
	})
	s := MustStart(t, func(c *config.Config) { up.configure(t, c, config.SchemeBearer, "", false) })
	ctx := t.Context()
	created, err := s.client.CreateSession(ctx, service.CreateSessionRequest{Network: "allowlist"})
	if err != nil {
		t.Fatal(err)
	}
	// A session's sandbox forwards no loopback address (a task's worker
	// does): git goes through the proxy variables.
	var out strings.Builder
	end, err := s.client.ExecSession(ctx, created.SessionID, httpapi.ExecBody{
		Command: shell("cd /tmp && NO_PROXY= no_proxy= GIT_TERMINAL_PROMPT=0 git clone -q " + up.ruled() + "/allowed/repo.git r 2>&1 && cat r/README"),
	}, func(ch httpapi.ExecChunk) error { out.Write(ch.Bytes()); return nil })
	if err != nil || end.ExitCode != 0 || out.String() != "hello to a session\n" {
		t.Fatalf("clone in a session: %v, exit %d, %q", err, end.ExitCode, out.String())
	}
	t.Cleanup(func() { s.client.DeleteSession(context.Background(), created.SessionID) })
	// The proxy records a request once it has ended, which can be just
	// after the command saw its answer.
	var credited bool
	for deadline := time.Now().Add(10 * time.Second); !credited && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		err = s.client.Events(ctx, service.EventsRequest{}, func(e eventstore.Event) error {
			if strings.Contains(string(e.Data), up.secret) {
				t.Fatalf("the secret is in event %s (%s)", e.ID, e.Type)
			}
			var ec task.EgressConnection
			if e.StreamID == session.StreamID(created.SessionID) && e.Type == task.EventEgressConnection && json.Unmarshal(e.Data, &ec) == nil && ec.Credential {
				credited = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if !credited {
		t.Error("no egress_connection event of the session says the credential was added")
	}
}
