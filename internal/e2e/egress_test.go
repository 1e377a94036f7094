//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes/k8stest"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// fetchResult is one step of egressfetch's report (testdata/egressfetch).
type fetchResult struct {
	Step   string `json:"step"`
	Arg    string `json:"arg"`
	OK     bool   `json:"ok"`
	Status int    `json:"status"`
	Body   string `json:"body"`
	Error  string `json:"error"`
}

// loopbackServer is an HTTP server on the host's loopback that records the
// paths it served.
type loopbackServer struct {
	port  int
	addr  string // 127.0.0.1:port
	mu    sync.Mutex
	paths []string
}

func mustLoopbackServer(t *testing.T) *loopbackServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &loopbackServer{port: ln.Addr().(*net.TCPAddr).Port, addr: ln.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.paths = append(s.paths, r.URL.Path)
		s.mu.Unlock()
		fmt.Fprintf(w, "hello from the host: %s", r.URL.Path)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return s
}

func (s *loopbackServer) served() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.paths...)
}

// mustInstallFetch builds egressfetch into the data root's shared/bin,
// which sandboxes see read-only at /workspace/shared/bin.
func mustInstallFetch(t *testing.T, data string) string {
	t.Helper()
	dir := filepath.Join(data, "shared", "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "egressfetch"), "./testdata/egressfetch")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build egressfetch: %v\n%s", err, out)
	}
	return "/workspace/shared/bin/egressfetch"
}

// mustStartAllowing starts a server whose egress allowlist is hostport
// alone, with egressfetch installed; it returns the server and the tool's
// path in the sandboxes.
func mustStartAllowing(t *testing.T, hostport string) (*server, string) {
	t.Helper()
	s := MustStart(t, func(c *config.Config) { c.Egress.Allow = []string{hostport} })
	return s, mustInstallFetch(t, s.data)
}

// spawnNet spawns a command-agent task with a network policy.
func spawnNet(t *testing.T, c *httpapi.Client, network string, argv ...string) task.Task {
	t.Helper()
	return mustSpawn(t, c, service.SpawnRequest{TaskDescription: "egress " + network, Agent: "command", Command: argv, Network: network})
}

func readFetch(t *testing.T, data, id string) map[string]fetchResult {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(data, "tasks", id, "output", "result.json"))
	if err != nil {
		t.Fatalf("egressfetch wrote no result: %v", err)
	}
	var rs []fetchResult
	if err := json.Unmarshal(b, &rs); err != nil {
		t.Fatal(err)
	}
	out := map[string]fetchResult{}
	for _, r := range rs {
		out[r.Step+" "+r.Arg] = r
	}
	return out
}

// egressEvents polls the task's stream until want(events) holds.
func egressEvents(t *testing.T, c *httpapi.Client, id string, want func([]task.EgressConnection) bool) []task.EgressConnection {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var got []task.EgressConnection
		err := c.Events(context.Background(), service.EventsRequest{TaskID: id}, func(e eventstore.Event) error {
			if e.Type != task.EventEgressConnection {
				return nil
			}
			var ec task.EgressConnection
			if err := json.Unmarshal(e.Data, &ec); err != nil {
				return err
			}
			if e.Actor != "corral/egress" {
				return fmt.Errorf("egress event with actor %q", e.Actor)
			}
			got = append(got, ec)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if want(got) {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("egress events of %s: %+v", id, got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func findEvent(evs []task.EgressConnection, method, host string, allowed bool) (task.EgressConnection, bool) {
	for _, e := range evs {
		if e.Method == method && e.Host == host && e.Allowed == allowed {
			return e, true
		}
	}
	return task.EgressConnection{}, false
}

// TestEgressAllowlist runs egressfetch in a real sandbox with network
// allowlist and the host's loopback server listed by address: the listed
// server is reached through the proxy (plain HTTP and CONNECT), an
// unlisted host and the same server under another name are refused with
// 403, a direct connection fails, and every attempt is an event. On the
// default runtime the sandbox mounts the proxy's socket; on kubernetes the
// pod reaches the proxy over TCP (kubernetes.egress_listen) with the
// task's key.
func TestEgressAllowlist(t *testing.T) {
	t.Parallel()
	t.Run("default runtime", func(t *testing.T) {
		t.Parallel()
		testEgressAllowlist(t, true, func(testing.TB, *config.Config) {})
	})
	t.Run("kubernetes", func(t *testing.T) {
		t.Parallel()
		testEgressAllowlist(t, false, func(tb testing.TB, c *config.Config) {
			onKubernetes("")(tb, c)
			c.Runtime = "kubernetes"
			c.Kubernetes.EgressListen = k8stest.NodeIP + ":0"
		})
	})
}

// testEgressAllowlist is TestEgressAllowlist on the runtime edit sets up;
// socket: its sandboxes mount the proxy's socket.
func testEgressAllowlist(t *testing.T, socket bool, edit func(testing.TB, *config.Config)) {
	up := mustLoopbackServer(t)
	hostport := up.addr
	unlisted := mustLoopbackServer(t)
	s := MustStart(t, func(c *config.Config) {
		edit(t, c)
		c.Egress.Mode = "allowlist"
		c.Egress.Allow = []string{"api.anthropic.com", hostport}
	})
	fetch := mustInstallFetch(t, s.data)
	denied := fmt.Sprintf("http://localhost:%d/by-another-name", up.port)
	tk := spawnNet(t, s.client, "allowlist", fetch,
		"env",
		"stat", "/run/corral/egress/proxy.sock",
		"get", "http://"+hostport+"/plain",
		"connect", hostport,
		"get", "http://unlisted.example/",
		"get", denied,
		"connect", "api.anthropic.com:22",
		"dial", unlisted.addr,
		"direct", "http://"+hostport+"/forwarded",
	)
	s.waitSuccess(t, tk.ID, 90*time.Second)
	r := readFetch(t, s.data, tk.ID)
	if e := r["env "]; !strings.Contains(e.Body, "HTTP_PROXY=http://127.0.0.1:3128") || !strings.Contains(e.Body, "HTTPS_PROXY=http://127.0.0.1:3128") || !strings.Contains(e.Body, "NO_PROXY=localhost,127.0.0.1") {
		t.Errorf("agent proxy environment:\n%s", e.Body)
	}
	if st := r["stat /run/corral/egress/proxy.sock"]; st.OK != socket {
		t.Errorf("the proxy socket in the sandbox: %v (%s), want %v", st.OK, st.Error, socket)
	}
	if g := r["get http://"+hostport+"/plain"]; !g.OK || g.Body != "hello from the host: /plain" {
		t.Errorf("allowed GET through the proxy: %+v", g)
	}
	if c := r["connect "+hostport]; !c.OK || c.Body != "hello from the host: /tunnel" {
		t.Errorf("allowed CONNECT through the proxy: %+v", c)
	}
	for _, k := range []string{"get http://unlisted.example/", "get " + denied, "connect api.anthropic.com:22"} {
		if g := r[k]; g.Status != http.StatusForbidden || !strings.Contains(g.Body, "denied") {
			t.Errorf("%s: %+v, want 403 from the proxy", k, g)
		}
	}
	// The listed loopback address is forwarded inside the sandbox, at the
	// same address, through the proxy (a CONNECT it records), so a client
	// that sends loopback past the proxy (NO_PROXY) reaches the host's
	// server; an unlisted port has nothing behind it: the sandbox's
	// loopback is its own.
	if d := r["direct http://"+hostport+"/forwarded"]; !d.OK || d.Body != "hello from the host: /forwarded" {
		t.Errorf("a direct GET of the listed loopback address inside the sandbox: %+v", d)
	}
	if d := r["dial "+unlisted.addr]; d.OK {
		t.Errorf("a connection to an unlisted port of the host's loopback succeeded")
	}
	if got := unlisted.served(); len(got) != 0 {
		t.Errorf("the unlisted server served %v", got)
	}
	got := up.served()
	if strings.Join(got, ",") != "/plain,/tunnel,/forwarded" {
		t.Errorf("the host's server served %v, want exactly /plain, /tunnel and /forwarded", got)
	}

	evs := egressEvents(t, s.client, tk.ID, func(evs []task.EgressConnection) bool { return len(evs) >= 6 })
	if n := countEvents(evs, "CONNECT", "127.0.0.1", true); n != 2 {
		t.Errorf("%d allowed CONNECTs to 127.0.0.1, want 2 (the tunnel and the forwarded GET): %+v", n, evs)
	}
	if e, ok := findEvent(evs, "GET", "127.0.0.1", true); !ok || e.Port != up.port || e.Status != 200 || e.BytesDown == 0 || e.BytesUp == 0 || e.Address != hostport {
		t.Errorf("allowed GET event: %+v (found %v)", e, ok)
	}
	if e, ok := findEvent(evs, "CONNECT", "127.0.0.1", true); !ok || e.BytesDown == 0 || e.BytesUp == 0 || e.DurationSeconds < 0 {
		t.Errorf("allowed CONNECT event: %+v (found %v)", e, ok)
	}
	if e, ok := findEvent(evs, "GET", "unlisted.example", false); !ok || e.Reason == "" || e.Status != 403 || e.Port != 80 {
		t.Errorf("denied GET event: %+v (found %v)", e, ok)
	}
	if _, ok := findEvent(evs, "GET", "localhost", false); !ok {
		t.Errorf("no denied event for localhost (listed only by address): %+v", evs)
	}
	if e, ok := findEvent(evs, "CONNECT", "api.anthropic.com", false); !ok || e.Port != 22 {
		t.Errorf("denied CONNECT to a listed host's other port: %+v (found %v)", e, ok)
	}
	tkNow, err := s.client.Get(context.Background(), tk.ID)
	if err != nil || tkNow.Status != task.Success {
		t.Errorf("after egress events the task is %s, %v", tkNow.Status, err)
	}
	// The task ended: its proxy directory goes.
	waitNoDir(t, filepath.Join(s.data, "run", "egress", tk.ID))
}

// TestEgressNone checks that network none gets no proxy: no variables, no
// socket, and no way to the host's loopback server.
func TestEgressNone(t *testing.T) {
	t.Parallel()
	up := mustLoopbackServer(t)
	hostport := up.addr
	s, fetch := mustStartAllowing(t, hostport)
	tk := spawnNet(t, s.client, "none", fetch, "env", "stat", "/run/corral/egress", "get", "http://"+hostport+"/none", "dial", hostport)
	s.waitSuccess(t, tk.ID, 90*time.Second)
	r := readFetch(t, s.data, tk.ID)
	if e := r["env "]; e.OK {
		t.Errorf("network none has proxy variables:\n%s", e.Body)
	}
	if st := r["stat /run/corral/egress"]; st.OK {
		t.Errorf("network none has the egress directory mounted")
	}
	if g := r["get http://"+hostport+"/none"]; g.OK || g.Status != 0 {
		t.Errorf("network none reached the host: %+v", g)
	}
	if d := r["dial "+hostport]; d.OK {
		t.Errorf("network none: a direct connection succeeded")
	}
	if got := up.served(); len(got) != 0 {
		t.Errorf("the host's server served %v", got)
	}
	if _, err := os.Stat(filepath.Join(s.data, "run", "egress", tk.ID)); err == nil {
		t.Errorf("network none got an egress directory")
	}
}

// TestEgressSurvivesRestart stops the server while a task with network
// allowlist runs, starts another on the same data root, and checks that
// the task reaches the proxy again: the new server listens anew in the
// task's directory, which the sandbox has mounted.
func TestEgressSurvivesRestart(t *testing.T) {
	t.Parallel()
	testenv.RequireBwrap(t)
	up := mustLoopbackServer(t)
	hostport := up.addr
	data := testenv.TempDir(t)
	t.Cleanup(func() { killSandboxes(t, data) })
	edit := func(c *config.Config) { c.Egress.Allow = []string{hostport} }

	first, stop := startOn(t, data, edit)
	fetch := mustInstallFetch(t, data)
	tk := spawnNet(t, first, "allowlist", fetch, "get", "http://"+hostport+"/before", "wait", "/task/go", "get", "http://"+hostport+"/after")
	waitFor(t, "the first request", func() bool { return len(up.served()) == 1 })
	stop()

	second, stop2 := startOn(t, data, edit)
	defer stop2()
	waitFor(t, "the task reattached", func() bool {
		tk, err := second.Get(context.Background(), tk.ID)
		return err == nil && tk.Status == task.Running
	})
	if err := os.WriteFile(filepath.Join(data, "tasks", tk.ID, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 95*time.Second)
	defer cancel()
	res, err := second.Result(ctx, service.ResultRequest{TaskID: tk.ID, Wait: 90 * time.Second})
	if err != nil || res.Status != task.Success {
		t.Fatalf("task after restart: %+v, %v", res, err)
	}
	r := readFetch(t, data, tk.ID)
	if g := r["get http://"+hostport+"/after"]; !g.OK {
		t.Errorf("request after the restart: %+v", g)
	}
	if got := up.served(); strings.Join(got, ",") != "/before,/after" {
		t.Errorf("served %v", got)
	}
}

// startOn starts a server in this process on an existing data root and
// returns a client and a function that stops it (its sandboxes keep
// running, as after a crash).
func startOn(t *testing.T, data string, edit func(*config.Config)) (*httpapi.Client, func()) {
	t.Helper()
	cfg := testConfig(t, []string{}, data)
	cfg.Limits.StopGrace = config.Duration(2 * time.Second)
	edit(cfg)
	a, stop := runApp(t, cfg, nil, nil)
	return httpapi.NewClient("http://"+a.Addr(), a.Token()), stop
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not happen within 60s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitNoDir(t *testing.T, dir string) {
	t.Helper()
	waitFor(t, dir+" removed", func() bool {
		_, err := os.Stat(dir)
		return os.IsNotExist(err)
	})
}

// countEvents counts the egress events of method to host with allowed.
func countEvents(evs []task.EgressConnection, method, host string, allowed bool) int {
	n := 0
	for _, e := range evs {
		if e.Method == method && e.Host == host && e.Allowed == allowed {
			n++
		}
	}
	return n
}
