//go:build integration

package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/corral-dev/corral/internal/agent/agenttest"
	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/service/servicetest"
	"github.com/corral-dev/corral/internal/session"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
	"github.com/corral-dev/corral/internal/workerproto"
)

// sessionRuntimes are the runtimes the session tests run on, by name (an
// index into escapeRuntimes silently moved when one was put before it).
var sessionRuntimes = escapeRuntimesNamed("local", "gvisor", "docker")

// escapeRuntimesNamed returns the escapeRuntimes of those names, in order.
func escapeRuntimesNamed(names ...string) []escapeRuntime {
	var out []escapeRuntime
	for _, n := range names {
		i := slices.IndexFunc(escapeRuntimes, func(rt escapeRuntime) bool { return rt.name == n })
		if i < 0 {
			panic("no escape runtime " + n)
		}
		out = append(out, escapeRuntimes[i])
	}
	return out
}

func command(argv ...string) json.RawMessage {
	b, _ := json.Marshal(argv)
	return b
}

func shell(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

// TestSessions: on each runtime, a session streams a command's output as
// it comes, keeps stdout and stderr apart, returns exit codes, runs
// commands at once, times one out, and ends on DELETE.
func TestSessions(t *testing.T) {
	for _, rt := range sessionRuntimes {
		t.Run(rt.name, func(t *testing.T) {
			t.Parallel()
			rt.require(t)
			s := MustStart(t, rt.config(t))
			ctx := context.Background()
			created, err := s.client.CreateSession(ctx, session.CreateRequest{Runtime: rt.runtime, Labels: map[string]string{"who": "test"}})
			if err != nil {
				t.Fatal(err)
			}
			id := created.SessionID
			if !strings.HasPrefix(created.Token, session.TokenPrefix) || created.Session.Status != session.StatusRunning {
				t.Fatalf("created %+v", created)
			}

			// Streaming is real: the first line arrives before the second is
			// printed (the command waits a second in between).
			var chunks []httpapi.ExecChunk
			var firstAt time.Time
			start := time.Now()
			end, err := s.client.ExecSession(ctx, id, httpapi.ExecBody{Command: shell("echo one; sleep 1; echo two; echo err >&2; exit 3")}, func(ch httpapi.ExecChunk) error {
				if firstAt.IsZero() {
					firstAt = time.Now()
				}
				chunks = append(chunks, ch)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			for _, ch := range chunks {
				if ch.Type == "stdout" {
					stdout.Write(ch.Bytes())
				} else {
					stderr.Write(ch.Bytes())
				}
			}
			if end.ExitCode != 3 || stdout.String() != "one\ntwo\n" || stderr.String() != "err\n" {
				t.Errorf("exec: code %d, stdout %q, stderr %q; want 3, one two, err", end.ExitCode, stdout.String(), stderr.String())
			}
			if firstAt.Sub(start) > time.Since(start)-700*time.Millisecond {
				t.Errorf("the first chunk came %s after the start, the exec took %s: not streamed", firstAt.Sub(start), time.Since(start))
			}

			// Commands run as children of the session's exec agent, inside
			// the sandbox (not entered from outside with nsenter or the
			// engine's exec), so under its seccomp filter and no_new_privs.
			var who bytes.Buffer
			if _, err := s.client.ExecSession(ctx, id, httpapi.ExecBody{Command: shell(`tr '\0' ' ' < /proc/$PPID/cmdline; echo; grep -E '^(Seccomp|NoNewPrivs):' /proc/self/status`)}, func(ch httpapi.ExecChunk) error { who.Write(ch.Bytes()); return nil }); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(who.String(), "/run/corral/corral-worker worker session") {
				t.Errorf("the command's parent and status: %q, want the exec agent (corral-worker worker session)", who.String())
			}
			if rt.name == "local" && (!strings.Contains(who.String(), "Seccomp:\t2") || !strings.Contains(who.String(), "NoNewPrivs:\t1")) {
				t.Errorf("a session command's status: %q, want the sandbox's seccomp filter and no_new_privs", who.String())
			}

			// The exec agent's token, with which it answers for the session,
			// is out of its commands' reach (they run as its uid): its
			// memory is closed, and its environment too, or holds no token
			// (gVisor shows every process's environment to all).
			var peek bytes.Buffer
			if _, err := s.client.ExecSession(ctx, id, httpapi.ExecBody{Command: shell(`tr '\0' '\n' < /proc/$PPID/environ; (exec 3< /proc/$PPID/mem) && echo mem open || echo mem closed`)}, func(ch httpapi.ExecChunk) error { peek.Write(ch.Bytes()); return nil }); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(peek.String(), workerproto.EnvSessionToken+"=") || !strings.Contains(peek.String(), "mem closed") {
				t.Errorf("a command read its exec agent's environment and memory: %q, want neither the token nor the memory", peek.String())
			}
			// The exec agent runs with the worker's Ps, whatever the host's
			// CPUs (its environment, read from the host, where gVisor's
			// processes are not); its commands do not inherit that.
			maxProcs := workerproto.EnvMaxProcs + "=" + strconv.Itoa(workerproto.WorkerProcs)
			if !rt.gvisorKernel() {
				agents := workerEnvs(t, "session")
				if len(agents) == 0 {
					t.Fatal("no session's exec agent found")
				}
				for _, env := range agents {
					if !slices.Contains(env, maxProcs) {
						t.Errorf("a session's exec agent has environment %q: want %s", env, maxProcs)
					}
				}
			}
			var env bytes.Buffer
			if _, err := s.client.ExecSession(ctx, id, httpapi.ExecBody{Command: command("env")}, func(ch httpapi.ExecChunk) error { env.Write(ch.Bytes()); return nil }); err != nil {
				t.Fatal(err)
			}
			if strings.Contains("\n"+env.String(), "\n"+workerproto.EnvMaxProcs+"=") {
				t.Errorf("a session command's environment: %q, want no %s", env.String(), workerproto.EnvMaxProcs)
			}

			// The session keeps its files between commands; cwd and env apply.
			if _, err := s.client.ExecSession(ctx, id, httpapi.ExecBody{Command: command("sh", "-c", "echo $GREETING > kept.txt"), Env: map[string]string{"GREETING": "hi"}}, func(httpapi.ExecChunk) error { return nil }); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if _, err := s.client.ExecSession(ctx, id, httpapi.ExecBody{Command: command("cat", "kept.txt"), Cwd: session.Dir}, func(ch httpapi.ExecChunk) error { out.Write(ch.Bytes()); return nil }); err != nil || out.String() != "hi\n" {
				t.Errorf("a file from the last command: %q, %v", out.String(), err)
			}

			// A program that is not there: exit 127, saying so.
			if e, err := s.client.ExecSession(ctx, id, httpapi.ExecBody{Command: command("/no/such/program")}, func(httpapi.ExecChunk) error { return nil }); err != nil || e.ExitCode != 127 || e.Error == "" {
				t.Errorf("a missing program: %+v, %v; want 127 and why", e, err)
			}

			// Several at once; and one timed out.
			var wg sync.WaitGroup
			codes := make([]int, 3)
			for i := range codes {
				wg.Go(func() {
					e, err := s.client.ExecSession(ctx, id, httpapi.ExecBody{Command: shell("sleep 0.5; exit " + string(rune('4'+i)))}, func(httpapi.ExecChunk) error { return nil })
					if err != nil {
						t.Error(err)
					}
					codes[i] = e.ExitCode
				})
			}
			wg.Wait()
			if codes[0] != 4 || codes[1] != 5 || codes[2] != 6 {
				t.Errorf("concurrent execs ended %v, want 4 5 6", codes)
			}
			e, err := s.client.ExecSession(ctx, id, httpapi.ExecBody{Command: command("sleep", "30"), TimeoutSeconds: 1}, func(httpapi.ExecChunk) error { return nil })
			if err != nil || e.ExitCode != 124 || !strings.Contains(e.Error, "timed out") {
				t.Errorf("a timed-out exec: %+v, %v; want 124, timed out", e, err)
			}

			// A client that goes away leaves its command running.
			cctx, cancel := context.WithCancel(ctx)
			dir := filepath.Join(s.data, "sessions", id)
			go func() {
				for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
					if _, err := os.Stat(filepath.Join(dir, "started")); err == nil {
						break
					}
				}
				cancel()
			}()
			s.client.ExecSession(cctx, id, httpapi.ExecBody{Command: shell("touch started; sleep 1; touch finished")}, func(httpapi.ExecChunk) error { return nil })
			waitFor(t, "the command its client left", func() bool {
				_, err := os.Stat(filepath.Join(dir, "finished"))
				return err == nil
			})
			// A detached command: its id at once, its output read back
			// from any offset, whole and once, with its end.
			sc := s.client.Sessions()
			execID, err := sc.StartExec(ctx, id, service.SessionCommand{Shell: "echo one; sleep 0.5; echo two >&2; exit 3"})
			if err != nil || !strings.HasPrefix(execID, "exec-") {
				t.Fatalf("a detached exec: %q, %v", execID, err)
			}
			for _, from := range []int64{0, 2, 4, 8} {
				var got strings.Builder
				end, err := sc.ReadExec(ctx, id, execID, from, true, func(o service.ExecOutput) error {
					if o.Offset != from+int64(got.Len()) {
						t.Errorf("from %d: a chunk at %d after %d bytes", from, o.Offset, got.Len())
					}
					got.Write(o.Data)
					return nil
				})
				if want := "one\ntwo\n"[from:]; err != nil || end == nil || end.ExitCode != 3 || got.String() != want {
					t.Errorf("read from %d: %q, end %+v, %v; want %q and exit 3", from, got.String(), end, err, want)
				}
			}
			// And one killed by its id.
			execID, err = sc.StartExec(ctx, id, service.SessionCommand{Command: []string{"sleep", "30"}})
			if err != nil {
				t.Fatal(err)
			}
			if err := sc.KillExec(ctx, id, execID); err != nil {
				t.Fatal(err)
			}
			if end, err := sc.ReadExec(ctx, id, execID, 0, true, func(service.ExecOutput) error { return nil }); err != nil || end == nil || end.ExitCode != 128+9 {
				t.Errorf("a killed exec: %+v, %v; want exit 137", end, err)
			}
			if _, err := sc.ReadExec(ctx, id, "exec-nope", 0, false, func(service.ExecOutput) error { return nil }); !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("an exec that is not there: %v, want not found", err)
			}

			got, err := s.client.GetSession(ctx, id)
			if err != nil || got.Execs != 14 || got.Labels["who"] != "test" {
				t.Errorf("session after 14 execs: %+v, %v", got, err)
			}
			// The exec table every way of running a command in a sandbox
			// answers, through the session contract in process and over
			// HTTP.
			for name, sess := range map[string]service.Sessions{"manager": s.app.Services().Sessions, "http": s.client.Sessions()} {
				t.Run("exec table/"+name, func(t *testing.T) {
					sandboxtest.ExecTable(t, func(ctx context.Context, argv []string, dir string, env []string, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
						end, err := sess.Exec(ctx, id, service.SessionCommand{Command: argv, Dir: dir, Env: env, Stdin: stdin}, stdout, stderr)
						return end.ExitCode, err
					}, session.Dir, dir)
				})
			}

			if _, err := s.client.DeleteSession(ctx, id); err != nil {
				t.Fatal(err)
			}
			_, err = s.client.ExecSession(ctx, id, httpapi.ExecBody{Command: command("true")}, func(httpapi.ExecChunk) error { return nil })
			if !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("exec after DELETE: %v, want 404", err)
			}
			if got, _ := s.client.GetSession(ctx, id); got.Status != session.StatusEnded || got.EndReason != "deleted" {
				t.Errorf("after DELETE: %+v, want ended, deleted", got)
			}
		})
	}
}

// TestSessionContract: the session manager in process and the HTTP client
// answer the session contract alike (servicetest's sessions group), on the
// default runtime.
func TestSessionContract(t *testing.T) {
	t.Parallel()
	servicetest.RunSessions(t, map[string]func(*testing.T) service.Sessions{
		"manager": func(t *testing.T) service.Sessions { return MustStart(t, nil).app.Services().Sessions },
		"http":    func(t *testing.T) service.Sessions { return MustStart(t, nil).client.Sessions() },
	})
}

// TestSessionTokens: a session's token runs commands in its session and
// nothing else.
func TestSessionTokens(t *testing.T) {
	t.Parallel()
	s := MustStartEnv(t, []string{"CORRAL_API_TOKEN=admin-token-0123456789"}, nil)
	ctx := context.Background()
	a := mustCreateSession(t, s.client)
	b := mustCreateSession(t, s.client)
	asA := s.client.WithToken(a.Token)
	if _, err := asA.ExecSession(ctx, a.SessionID, httpapi.ExecBody{Command: command("true")}, func(httpapi.ExecChunk) error { return nil }); err != nil {
		t.Errorf("a session's token in its session: %v", err)
	}
	_, err := asA.ExecSession(ctx, b.SessionID, httpapi.ExecBody{Command: command("true")}, func(httpapi.ExecChunk) error { return nil })
	if !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("a session's token in another session: %v, want 403", err)
	}
	if _, err := asA.ListSessions(ctx); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("a session's token listing sessions: %v, want 401", err)
	}
	if _, err := asA.List(ctx, service.ListRequest{}); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("a session's token listing tasks: %v, want 401", err)
	}
	if _, err := s.client.WithToken("sess_wrong").GetSession(ctx, a.SessionID); !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("a wrong session token: %v, want 403", err)
	}
	// The unix socket every sandbox reaches takes a session's own token
	// alone: not another session's, not the API token.
	sock := "unix://" + filepath.Join(s.data, "run", "sock", "corral.sock")
	if _, err := httpapi.NewClient(sock, a.Token).ExecSession(ctx, a.SessionID, httpapi.ExecBody{Command: command("true")}, func(httpapi.ExecChunk) error { return nil }); err != nil {
		t.Errorf("a session's token on the socket: %v", err)
	}
	for name, c := range map[string]*httpapi.Client{"another session's token": httpapi.NewClient(sock, b.Token), "the API token": httpapi.NewClient(sock, "admin-token-0123456789")} {
		if _, err := c.ExecSession(ctx, a.SessionID, httpapi.ExecBody{Command: command("true")}, func(httpapi.ExecChunk) error { return nil }); !errors.Is(err, errdefs.ErrPermissionDenied) {
			t.Errorf("%s on the socket: %v, want 403", name, err)
		}
	}
	// Only the session's own exec agent attaches as it: the owner's token
	// (or a task's granted one) would otherwise see every command run in
	// the session.
	for name, token := range map[string]string{"the session's token": a.Token, "the API token": "admin-token-0123456789"} {
		conn, err := net.Dial("unix", strings.TrimPrefix(sock, "unix://"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST /api/sessions/%s/agent HTTP/1.1\r\nHost: corral\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: corral-exec/1\r\nContent-Length: 0\r\n\r\n", a.SessionID, token)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil || resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s attaching as the agent: %v, %v; want 403", name, resp.Status, err)
		}
		conn.Close()
	}
	if _, err := asA.ExecSession(ctx, a.SessionID, httpapi.ExecBody{Command: command("true")}, func(httpapi.ExecChunk) error { return nil }); err != nil {
		t.Errorf("the session after the refused attaches: %v", err)
	}

	// SSE for a client that asks for it.
	req, _ := http.NewRequest("POST", s.url+"/api/sessions/"+a.SessionID+"/exec", strings.NewReader(`{"command":"echo sse"}`))
	req.Header.Set("Authorization", "Bearer "+a.Token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var body bytes.Buffer
	body.ReadFrom(resp.Body)
	resp.Body.Close()
	if !strings.Contains(body.String(), "event: started\ndata: {\"type\":\"started\",\"exec_id\":\"exec-") ||
		!strings.Contains(body.String(), "event: stdout\ndata: {\"type\":\"stdout\",\"offset\":0,\"data\":\"sse\\n\"}") || !strings.Contains(body.String(), "event: exit") {
		t.Errorf("SSE exec: %s", body.String())
	}
}

// TestSessionLimits: resources, max_sessions and the idle timeout.
func TestSessionLimits(t *testing.T) {
	t.Parallel()
	s := MustStart(t, func(c *config.Config) { c.Sessions.MaxSessions = 1 })
	ctx := context.Background()
	if _, err := s.client.CreateSession(ctx, session.CreateRequest{Resources: &service.ResourceRequest{MemoryLimit: "1Ki"}}); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "resources.memory_limit") {
		t.Errorf("a session with 1Ki of memory: %v, want 400 naming resources.memory_limit", err)
	}
	small, err := s.client.CreateSession(ctx, session.CreateRequest{Resources: &service.ResourceRequest{PidsLimit: 32}})
	if err != nil {
		t.Fatal(err)
	}
	e, err := s.client.ExecSession(ctx, small.SessionID, httpapi.ExecBody{Command: shell("n=0; while [ $n -lt 60 ]; do sleep 5 & n=$((n+1)); done")}, func(httpapi.ExecChunk) error { return nil })
	if err != nil || e.ExitCode == 0 {
		t.Errorf("60 processes in a session of 32 pids: %+v, %v; want refused forks", e, err)
	}
	s.client.DeleteSession(ctx, small.SessionID)
	a, err := s.client.CreateSession(ctx, session.CreateRequest{IdleTimeout: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.CreateSession(ctx, session.CreateRequest{}); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("a second session over max_sessions 1: %v, want 429", err)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got, _ := s.client.GetSession(ctx, a.SessionID)
		if got.Status == session.StatusEnded {
			if got.EndReason != "idle_timeout" {
				t.Errorf("ended %s, want idle_timeout", got.EndReason)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the idle session did not end")
		}
	}
	if _, err := s.client.CreateSession(ctx, session.CreateRequest{}); err != nil {
		t.Errorf("a session once the idle one ended: %v", err)
	}
}

// TestSessionSurvivesKill9: a server killed with SIGKILL finds its session
// again after a restart, and the session keeps its files; a command that
// ran through the kill runs on, and its client reads its whole output
// once, and its end, from the next server.
func TestSessionSurvivesKill9(t *testing.T) {
	t.Parallel()
	data, srv := startKillable(t)
	ctx := context.Background()
	created := mustCreateSession(t, srv.client)
	// A link to /etc, which inside the sandbox is its own small /etc.
	if _, err := srv.client.ExecSession(ctx, created.SessionID, httpapi.ExecBody{Command: shell("echo before > f.txt; ln -s /etc etc-link")}, func(httpapi.ExecChunk) error { return nil }); err != nil {
		t.Fatal(err)
	}
	// The server dies during a command; the command outlives it, and
	// prints the rest once the next server is up.
	var (
		mu  sync.Mutex
		out bytes.Buffer
	)
	type result struct {
		end service.SessionExecEnd
		err error
	}
	res := make(chan result, 1)
	goFile := filepath.Join(data, "sessions", created.SessionID, "go")
	go func() {
		// 2 MB before the kill, 2 MB after, as random bytes: every byte
		// checked against the files the command writes.
		end, err := srv.client.ExecSession(ctx, created.SessionID, httpapi.ExecBody{Command: shell("head -c 2000000 /dev/urandom > a; cat a; while [ ! -e go ]; do sleep 0.05; done; head -c 2000000 /dev/urandom > b; cat b; exit 5")}, func(ch httpapi.ExecChunk) error {
			mu.Lock()
			defer mu.Unlock()
			out.Write(ch.Bytes())
			return nil
		})
		res <- result{end, err}
	}()
	waitFor(t, "the command's first 2 MB", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return out.Len() == 2000000
	})
	addr := strings.TrimPrefix(srv.url, "http://")
	srv.kill()
	srv = startProcessAt(t, data, addr, "")
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-res:
		mu.Lock()
		got := out.Bytes()
		mu.Unlock()
		a, _ := os.ReadFile(filepath.Join(data, "sessions", created.SessionID, "a"))
		b, _ := os.ReadFile(filepath.Join(data, "sessions", created.SessionID, "b"))
		if r.err != nil || r.end.ExitCode != 5 || r.end.Reason != "" || len(a) != 2000000 || !bytes.Equal(got, append(a, b...)) {
			t.Errorf("the command through the kill: %+v, %v, %d bytes of output; want exit 5 and the 4 MB it wrote, each byte once", r.end, r.err, len(got))
		}
	case <-time.After(90 * time.Second):
		t.Fatal("the command through the kill never ended for its client")
	}
	// At once, before the session's exec agent has dialled the new server
	// in: the command waits for it and runs inside the sandbox's view. It
	// ran from the host (nsenter, its working directory resolved through
	// /proc/PID/root, where the session's absolute link leads to the
	// host's /etc, shadow and all) until the agent came back.
	out.Reset()
	os.Remove(filepath.Join(data, "sessions", created.SessionID, "a"))
	os.Remove(filepath.Join(data, "sessions", created.SessionID, "b"))
	if _, err := srv.client.ExecSession(ctx, created.SessionID, httpapi.ExecBody{Command: shell("cat " + session.Dir + "/f.txt; test -e shadow && echo host-etc || echo own-etc"), Cwd: session.Dir + "/etc-link"}, func(ch httpapi.ExecChunk) error { out.Write(ch.Bytes()); return nil }); err != nil || out.String() != "before\nown-etc\n" {
		t.Errorf("after the restart: %q, %v; want the session reattached with its file, in its own /etc", out.String(), err)
	}
	if _, err := os.Stat(filepath.Join(data, "sessions", created.SessionID, "f.txt")); err != nil {
		t.Errorf("the session's directory: %v", err)
	}
	// Every exec has its end, none lost.
	open, lost := map[string]bool{}, 0
	err := srv.client.Events(ctx, service.EventsRequest{}, func(e eventstore.Event) error {
		if e.StreamID != session.StreamID(created.SessionID) {
			return nil
		}
		var p session.ExecEnd
		json.Unmarshal(e.Data, &p)
		switch e.Type {
		case session.EventExecStart:
			open[p.ExecID] = true
		case session.EventExecEnd:
			delete(open, p.ExecID)
			if p.Reason == "lost" {
				lost++
			}
		}
		return nil
	})
	if err != nil || len(open) != 0 || lost != 0 {
		t.Errorf("the session's execs after a kill -9: %d never ended, %d ended as lost (%v); want 0 and 0", len(open), lost, err)
	}
	srv.client.DeleteSession(ctx, created.SessionID)
}

// TestSessionCLI: corral sessions create, corral exec (streamed, -i, its
// exit code) and corral sessions rm.
func TestSessionCLI(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	var created httpapi.SessionCreated
	if err := json.Unmarshal([]byte(s.runCLI(t, "sessions", "create", "--server", s.url, "--json")), &created); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(corralBin, "exec", "-i", "--server", s.url, created.SessionID, "--", "sh", "-c", "cat; echo to-err >&2; exit 7")
	cmd.Env = append(os.Environ(), "CORRAL_API_TOKEN="+created.Token) // the session's own token is enough
	cmd.Stdin = strings.NewReader("from stdin\n")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 || out.String() != "from stdin\n" || errb.String() != "to-err\n" {
		t.Errorf("corral exec: %v, stdout %q, stderr %q; want exit 7, the stdin back, to-err", err, out.String(), errb.String())
	}
	if got := s.runCLI(t, "sessions", "rm", "--server", s.url, created.SessionID); got != created.SessionID+" ended\n" {
		t.Errorf("sessions rm: %q", got)
	}
	if got := s.runCLI(t, "sessions", "--server", s.url); !strings.Contains(got, created.SessionID) || !strings.Contains(got, "ended (deleted)") {
		t.Errorf("sessions ls: %q", got)
	}
}

// TestClaudeThroughSession: the real Claude Code CLI, given a session,
// is offered no shell of its own but workspace_exec, and the command it
// runs with it runs in the session (it reads a file only the session has).
func TestClaudeThroughSession(t *testing.T) {
	t.Parallel()
	s, ep := mustClaudeServer(t, agenttest.AnthropicOptions{Replies: []agenttest.Reply{
		{Text: "Reading the marker.", Tool: &agenttest.ToolCall{Name: "mcp__corral__workspace_exec", Input: map[string]any{"command": "cat /workspace/session/marker.txt"}}},
		{Text: "The marker says hello."},
	}})
	ctx := context.Background()
	created := mustCreateSession(t, s.client)
	if _, err := s.client.ExecSession(ctx, created.SessionID, httpapi.ExecBody{Command: shell("echo only-in-the-session > marker.txt")}, func(httpapi.ExecChunk) error { return nil }); err != nil {
		t.Fatal(err)
	}
	tk := spawnClaude(t, s, service.SpawnRequest{TaskDescription: "What does the marker say?", SessionID: created.SessionID})
	s.waitSuccess(t, tk.ID, 3*time.Minute)
	var sawTools, sawResult bool
	for _, r := range ep.Requests() {
		if !r.Main {
			continue
		}
		sawTools = true
		if slices.Contains(r.Tools, "Bash") || !slices.Contains(r.Tools, "mcp__corral__workspace_exec") {
			t.Errorf("request %d offers tools %v: want workspace_exec and no Bash", r.Reply, r.Tools)
		}
		if strings.Contains(r.LastUser, "only-in-the-session") {
			sawResult = true
		}
	}
	if !sawTools || !sawResult {
		t.Errorf("the model never saw the session's file through workspace_exec (requests: %d)", len(ep.Requests()))
	}
	if got, err := s.client.GetSession(ctx, created.SessionID); err != nil || got.Execs != 2 {
		t.Errorf("session after the agent's command: %+v, %v; want 2 execs", got, err)
	}
	// Another agent cannot take a session.
	_, _, err := s.client.Spawn(ctx, service.SpawnRequest{TaskDescription: "x", Agent: "codex", SessionID: created.SessionID})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "claude can") {
		t.Errorf("codex with a session: %v, want 422 saying only claude can", err)
	}
	assertSecretAbsent(t, s, tk.ID, claudeTestKey)
}

// TestSessionNetwork: a session with network allowlist reaches a listed
// host through its own egress proxy (recorded on the session's stream) and
// nothing else; one without a network reaches nothing.
func TestSessionNetwork(t *testing.T) {
	t.Parallel()
	up := mustLoopbackServer(t)
	hostport := up.addr
	s, fetch := mustStartAllowing(t, hostport)
	ctx := context.Background()
	run := func(network string) map[string]fetchResult {
		created, err := s.client.CreateSession(ctx, session.CreateRequest{Network: network})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.client.DeleteSession(context.Background(), created.SessionID) })
		if created.Session.Network != network {
			t.Errorf("session network %q, want %q", created.Session.Network, network)
		}
		end, err := s.client.ExecSession(ctx, created.SessionID, httpapi.ExecBody{Command: shell("mkdir -p output && " + fetch + " get http://" + hostport + "/from-session get http://unlisted.example/")}, func(httpapi.ExecChunk) error { return nil })
		if err != nil || end.ExitCode != 0 {
			t.Fatalf("egressfetch in a %s session: %+v, %v", network, end, err)
		}
		b, err := os.ReadFile(filepath.Join(s.data, "sessions", created.SessionID, "output", "result.json"))
		if err != nil {
			t.Fatal(err)
		}
		var rs []fetchResult
		json.Unmarshal(b, &rs)
		out := map[string]fetchResult{}
		for _, r := range rs {
			out[r.Step+" "+r.Arg] = r
		}
		if network == "allowlist" {
			// The proxy records a connection once it has ended, which can
			// be just after the command saw its answer and exited.
			var hosts []string
			for deadline := time.Now().Add(10 * time.Second); len(hosts) < 2 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				hosts = nil
				s.client.Events(ctx, service.EventsRequest{}, func(e eventstore.Event) error {
					if e.StreamID == session.StreamID(created.SessionID) && e.Type == task.EventEgressConnection {
						hosts = append(hosts, string(e.Data))
					}
					return nil
				})
			}
			if len(hosts) < 2 {
				t.Errorf("the session's stream has %d egress connections, want both attempts", len(hosts))
			}
		}
		return out
	}
	r := run("allowlist")
	if g := r["get http://"+hostport+"/from-session"]; !g.OK || g.Body != "hello from the host: /from-session" {
		t.Errorf("a listed host from an allowlist session: %+v", g)
	}
	if g := r["get http://unlisted.example/"]; g.OK {
		t.Errorf("an unlisted host from an allowlist session: %+v", g)
	}
	r = run("none")
	if g := r["get http://"+hostport+"/from-session"]; g.OK {
		t.Errorf("a listed host from a session without a network: %+v", g)
	}
}

// TestSessionDiskQuota: a session's own directory is held to the task
// directories' quota (an exec wrote 287 MiB with max_task_dir_bytes 64MiB
// before): a command filling it ends the session as disk_quota, with the
// quota's error, and stops growing. An ended session's directory stays for
// the retention; a deleted one's is removed, and the removal recorded.
func TestSessionDiskQuota(t *testing.T) {
	t.Parallel()
	s := MustStart(t, func(c *config.Config) {
		c.Limits.MaxTaskDirBytes, _ = config.ParseSize("16MiB")
	})
	ctx := context.Background()
	full := mustCreateSession(t, s.client)
	dir := filepath.Join(s.data, "sessions", full.SessionID)
	// As fast as the disk takes it, in 1 MiB files (each under the
	// sandbox's file size limit, which alone would stop one big file).
	e, err := s.client.ExecSession(ctx, full.SessionID, httpapi.ExecBody{Command: command("split", "-b", "1048576", "-a", "6", "/dev/zero", "f")}, func(httpapi.ExecChunk) error { return nil })
	t.Logf("the filler's exec: %+v, %v", e, err)
	var got session.Session
	waitFor(t, "the full session ended", func() bool {
		got, _ = s.client.GetSession(ctx, full.SessionID)
		return got.Status == session.StatusEnded
	})
	if got.EndReason != "disk_quota" || !strings.HasPrefix(got.EndError, "output quota exceeded: the session directory holds") {
		t.Fatalf("the full session ended %q: %q; want disk_quota with the quota's error", got.EndReason, got.EndError)
	}
	size := func() (n int64) {
		filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
			if err == nil && fi.Mode().IsRegular() {
				n += fi.Size()
			}
			return nil
		})
		return n
	}
	first := size()
	time.Sleep(300 * time.Millisecond)
	if again := size(); again != first {
		t.Errorf("the session's directory grew from %d to %d bytes after its end", first, again)
	}
	t.Logf("a fast filler against a 16 MiB polled quota: %d MiB written", first>>20)
	// Ended by its quota, its directory stays for the retention (48 h).
	time.Sleep(1500 * time.Millisecond)
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("an ended session's directory is gone before its retention: %v", err)
	}

	deleted := mustCreateSession(t, s.client)
	if _, err := s.client.ExecSession(ctx, deleted.SessionID, httpapi.ExecBody{Command: shell("echo x > kept.txt")}, func(httpapi.ExecChunk) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.DeleteSession(ctx, deleted.SessionID); err != nil {
		t.Fatal(err)
	}
	// The removal is recorded once it is done.
	var types []string
	waitFor(t, "the deleted session's directory removed", func() bool {
		types = s.eventTypes(t, session.StreamID(deleted.SessionID))
		return slices.Contains(types, session.EventDirRemoved)
	})
	if _, err := os.Stat(filepath.Join(s.data, "sessions", deleted.SessionID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the deleted session's directory is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.data, "run", "sessions", deleted.SessionID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the deleted session's command output is still kept: %v", err)
	}
	if types[len(types)-1] != session.EventDirRemoved || !slices.Contains(types, session.EventEnded) {
		t.Errorf("the deleted session's events %v, want its end and then %s", types, session.EventDirRemoved)
	}
}

// TestExecClientReconnects: a client whose stream breaks mid-command (its
// connection cut by a proxy between it and the server) reads on from
// where it was, and gets the command's 3 MB of output byte for byte,
// once; a quiet command's stream carries a heartbeat.
func TestExecClientReconnects(t *testing.T) {
	t.Parallel()
	// The proxy's own port is in the client's Host header.
	s := MustStart(t, func(c *config.Config) { c.HTTP.AllowedHosts = []string{"127.0.0.1"} })
	ctx := context.Background()
	created := mustCreateSession(t, s.client)
	// A proxy that cuts every connection after 1 MB toward the client.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var conns atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			up, err := net.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
			if err != nil {
				c.Close()
				continue
			}
			go func() { io.Copy(up, c); up.Close() }()
			go func() { io.CopyN(c, up, 1<<20); c.Close(); up.Close() }()
		}
	}()
	via := httpapi.NewClient("http://"+ln.Addr().String(), s.token)
	var got bytes.Buffer
	end, err := via.ExecSession(ctx, created.SessionID, httpapi.ExecBody{Command: shell("head -c 3000000 /dev/urandom > out.bin; cat out.bin")}, func(ch httpapi.ExecChunk) error {
		got.Write(ch.Bytes())
		return nil
	})
	want, _ := os.ReadFile(filepath.Join(s.data, "sessions", created.SessionID, "out.bin"))
	if err != nil || end.ExitCode != 0 || len(want) != 3000000 || !bytes.Equal(got.Bytes(), want) {
		t.Errorf("through a cutting proxy: %+v, %v, %d bytes (want the %d written, once)", end, err, got.Len(), len(want))
	}
	if n := conns.Load(); n < 3 {
		t.Errorf("%d connections through the proxy: the stream was never cut", n)
	}

	// Quiet for longer than the heartbeat's interval.
	req, _ := http.NewRequest("POST", s.url+"/api/sessions/"+created.SessionID+"/exec", strings.NewReader(`{"command":"sleep 17; echo awake"}`))
	req.Header.Set("Authorization", "Bearer "+s.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var types []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var ch httpapi.ExecChunk
		json.Unmarshal(sc.Bytes(), &ch)
		types = append(types, ch.Type)
	}
	if !slices.Equal(types, []string{"started", "heartbeat", "stdout", "exit"}) {
		t.Errorf("a quiet command's stream: %v; want started, heartbeat, stdout, exit", types)
	}
}

// TestSessionSuspendResume: a suspended session holds no sandbox, keeps
// its files and says its processes ended; it stays suspended through a
// server killed with SIGKILL; a resume (or a command) brings it back on
// the same directory, its token working, with a process started before
// the suspend gone, as the answer said.
func TestSessionSuspendResume(t *testing.T) {
	t.Parallel()
	data, srv := startKillable(t)
	ctx := context.Background()
	created := mustCreateSession(t, srv.client)
	sc := srv.client.Sessions()
	if _, err := srv.client.ExecSession(ctx, created.SessionID, httpapi.ExecBody{Command: shell("echo kept > f.txt; (sleep 317 >/dev/null 2>&1 &) ; echo started")}, func(httpapi.ExecChunk) error { return nil }); err != nil {
		t.Fatal(err)
	}
	// A command running through the suspend ends with it, lost. (317: the
	// processes are counted host-wide, and other tests' sleep 300.)
	running, err := sc.StartExec(ctx, created.SessionID, service.SessionCommand{Shell: "sleep 317"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the background process", func() bool { return countProcesses("sleep", "317") >= 2 })
	r, err := sc.Suspend(ctx, created.SessionID)
	if err != nil || r.Session.Status != service.SessionSuspended || r.MemoryKept || !strings.Contains(r.Note, "processes ended") {
		t.Fatalf("suspend: %+v, %v; want suspended, memory not kept, and said so", r, err)
	}
	if n := countProcesses("sleep", "317"); n != 0 {
		t.Errorf("%d of the session's processes run on while it is suspended", n)
	}
	if end, err := sc.ReadExec(ctx, created.SessionID, running, 0, true, func(service.ExecOutput) error { return nil }); err != nil || end == nil || end.Reason != "lost" || !strings.Contains(end.Error, "suspended") {
		t.Errorf("the command the suspend cut: %+v, %v; want lost, saying why", end, err)
	}
	// Through a kill -9, still suspended.
	addr := strings.TrimPrefix(srv.url, "http://")
	srv.kill()
	srv = startProcessAt(t, data, addr, "")
	sc = srv.client.Sessions()
	if s, err := srv.client.GetSession(ctx, created.SessionID); err != nil || s.Status != service.SessionSuspended {
		t.Fatalf("after a restart: %+v, %v; want suspended", s, err)
	}
	// A command with the session's own token resumes it first.
	var out strings.Builder
	end, err := srv.client.WithToken(created.Token).ExecSession(ctx, created.SessionID, httpapi.ExecBody{Command: shell("cat f.txt; pgrep -x sleep || echo no-old-process")}, func(ch httpapi.ExecChunk) error { out.Write(ch.Bytes()); return nil })
	if err != nil || end.ExitCode != 0 || out.String() != "kept\nno-old-process\n" {
		t.Errorf("a command on the suspended session: %+v, %q, %v; want its file and none of its old processes", end, out.String(), err)
	}
	if s, err := srv.client.GetSession(ctx, created.SessionID); err != nil || s.Status != service.SessionRunning {
		t.Errorf("after the command: %+v, %v; want running", s, err)
	}
	// Suspend and resume again, each asked by a client that goes away
	// at once: begun, they finish; the stream says each.
	status := func(want string) func() bool {
		return func() bool {
			s, err := srv.client.GetSession(ctx, created.SessionID)
			return err == nil && s.Status == want
		}
	}
	path := "/api/sessions/" + created.SessionID
	dropRequest(t, srv.url, http.MethodPost, path+"/suspend", "")
	waitFor(t, "the suspend its client left", status(service.SessionSuspended))
	dropRequest(t, srv.url, http.MethodPost, path+"/resume", "")
	waitFor(t, "the resume its client left", status(service.SessionRunning))
	// Two suspends at once: one suspends it, the other finds it
	// suspended (one event); then a command whose caller goes away while
	// it resumes the session.
	var twice errgroup.Group
	for range 2 {
		twice.Go(func() error {
			r, err := sc.Suspend(ctx, created.SessionID)
			if err == nil && r.Session.Status != service.SessionSuspended {
				err = fmt.Errorf("answered %s", r.Session.Status)
			}
			return err
		})
	}
	if err := twice.Wait(); err != nil {
		t.Errorf("one of two suspends at once: %v", err)
	}
	dropRequest(t, srv.url, http.MethodPost, path+"/exec", `{"command": "echo resumed > resumed.txt"}`)
	waitFor(t, "the command its client left", func() bool {
		out.Reset()
		srv.client.ExecSession(ctx, created.SessionID, httpapi.ExecBody{Command: shell("cat resumed.txt")}, func(ch httpapi.ExecChunk) error { out.Write(ch.Bytes()); return nil })
		return out.String() == "resumed\n"
	})
	var types []string
	srv.client.Events(ctx, service.EventsRequest{}, func(e eventstore.Event) error {
		if e.StreamID == session.StreamID(created.SessionID) && (e.Type == session.EventSuspended || e.Type == session.EventResumed || e.Type == session.EventEnded) {
			types = append(types, e.Type)
		}
		return nil
	})
	if want := slices.Repeat([]string{session.EventSuspended, session.EventResumed}, 3); !slices.Equal(types, want) {
		t.Errorf("the session's stream: %v, want %v", types, want)
	}
	dropRequest(t, srv.url, http.MethodDelete, path, "")
	waitFor(t, "the delete its client left", status(service.SessionEnded))
}

// dropRequest sends a request to the server at url and closes the
// connection once it is written, reading no answer: a client that goes
// away while the server does what it asked.
func dropRequest(t *testing.T, url, method, path, body string) {
	t.Helper()
	host := strings.TrimPrefix(url, "http://")
	conn, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", method, path, host, len(body), body); err != nil {
		t.Fatal(err)
	}
}

// TestIdleSessionSuspended: with sessions.idle_action suspend, a session
// idle past its timeout is suspended, not ended, and comes back with its
// files on the next command.
func TestIdleSessionSuspended(t *testing.T) {
	t.Parallel()
	s := MustStart(t, func(c *config.Config) { c.Sessions.IdleAction = config.IdleSuspend })
	ctx := context.Background()
	created, err := s.client.CreateSession(ctx, service.CreateSessionRequest{IdleTimeout: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.ExecSession(ctx, created.SessionID, httpapi.ExecBody{Command: shell("echo kept > f.txt")}, func(httpapi.ExecChunk) error { return nil }); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the idle session suspended", func() bool {
		got, err := s.client.GetSession(ctx, created.SessionID)
		return err == nil && got.Status == service.SessionSuspended
	})
	var out strings.Builder
	if _, err := s.client.ExecSession(ctx, created.SessionID, httpapi.ExecBody{Command: shell("cat f.txt")}, func(ch httpapi.ExecChunk) error { out.Write(ch.Bytes()); return nil }); err != nil || out.String() != "kept\n" {
		t.Errorf("a command on the idle-suspended session: %q, %v", out.String(), err)
	}
	s.client.DeleteSession(ctx, created.SessionID)
}

// TestExecOfASessionLostWithItsServer: a session whose sandbox died with
// its server (killed with SIGKILL) while a command ran is ended lost by the
// next server, and so is the command: none stays open.
func TestExecOfASessionLostWithItsServer(t *testing.T) {
	t.Parallel()
	data, srv := startKillable(t)
	ctx := context.Background()
	created := mustCreateSession(t, srv.client)
	execID, err := srv.client.Sessions().StartExec(ctx, created.SessionID, service.SessionCommand{Shell: "sleep 300"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the command running", func() bool { return countProcesses("sleep", "300") > 0 })
	srv.kill()
	if err := exec.Command("pkill", "-KILL", "-f", created.SessionID).Run(); err != nil {
		t.Fatalf("kill the session's sandbox: %v", err)
	}
	srv = startProcess(t, data)
	if s, err := srv.client.GetSession(ctx, created.SessionID); err != nil || s.Status != service.SessionEnded || s.EndReason != "lost" {
		t.Fatalf("the session after the restart: %+v, %v; want ended lost", s, err)
	}
	end, err := srv.client.Sessions().ReadExec(ctx, created.SessionID, execID, 0, false, func(service.ExecOutput) error { return nil })
	if err != nil || end == nil || end.Reason != "lost" {
		t.Errorf("its command: %+v, %v; want ended lost", end, err)
	}
}

// TestSessionSandboxEndsUnderItsServer: a running session whose sandbox
// ends while its server runs (its processes killed from outside) is ended
// lost, saying so, and so is its command: it does not show as running
// until its idle timeout. On docker its container is killed through the
// engine, elsewhere every process naming it.
func TestSessionSandboxEndsUnderItsServer(t *testing.T) {
	for _, rt := range sessionRuntimes {
		t.Run(rt.name, func(t *testing.T) {
			t.Parallel()
			rt.require(t)
			s := MustStart(t, rt.config(t))
			ctx := context.Background()
			created, err := s.client.CreateSession(ctx, session.CreateRequest{Runtime: rt.runtime})
			if err != nil {
				t.Fatal(err)
			}
			execID, err := s.client.Sessions().StartExec(ctx, created.SessionID, service.SessionCommand{Shell: "sleep 300"})
			if err != nil {
				t.Fatal(err)
			}
			if rt.runtime == "docker" {
				engine := []string{"-H", "unix://" + testenv.DockerSocket}
				out, err := exec.Command("docker", append(engine, "ps", "-q", "--filter", "name="+created.SessionID)...).Output()
				if err != nil || len(strings.Fields(string(out))) != 1 {
					t.Fatalf("the session's container: %q, %v", out, err)
				}
				if out, err := exec.Command("docker", append(engine, "kill", strings.TrimSpace(string(out)))...).CombinedOutput(); err != nil {
					t.Fatalf("docker kill: %v %s", err, out)
				}
			} else if err := exec.Command("pkill", "-KILL", "-f", created.SessionID).Run(); err != nil {
				t.Fatalf("kill the session's sandbox: %v", err)
			}
			waitFor(t, "the session's end", func() bool {
				got, err := s.client.GetSession(ctx, created.SessionID)
				return err == nil && got.Status == service.SessionEnded
			})
			got, _ := s.client.GetSession(ctx, created.SessionID)
			if got.EndReason != "lost" || !strings.Contains(got.EndError, "sandbox") {
				t.Errorf("the session ended %q: %q; want lost, saying its sandbox ended", got.EndReason, got.EndError)
			}
			end, err := s.client.Sessions().ReadExec(ctx, created.SessionID, execID, 0, false, func(service.ExecOutput) error { return nil })
			if err != nil || end == nil || end.Reason != "lost" {
				t.Errorf("its command: %+v, %v; want ended lost", end, err)
			}
		})
	}
}

// TestSessionRemembersItsWorkspacesSettings: a session created on a
// workspace without an image or limits of its own gets those of the last
// session there (seed 003's project settings); one that names its own
// keeps them.
func TestSessionRemembersItsWorkspacesSettings(t *testing.T) {
	testenv.RequireDocker(t)
	t.Parallel()
	s := MustStart(t, nil)
	ctx := context.Background()
	if _, err := s.client.CreateProject(ctx, service.CreateProjectRequest{Name: "site"}); err != nil {
		t.Fatal(err)
	}
	first, err := s.client.CreateSession(ctx, service.CreateSessionRequest{Runtime: "docker", Image: testenv.DockerPythonImage, Workspace: "site",
		Resources: &service.ResourceRequest{MemoryLimit: "300Mi", PidsLimit: 77}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.DeleteSession(ctx, first.SessionID); err != nil {
		t.Fatal(err)
	}
	again, err := s.client.CreateSession(ctx, service.CreateSessionRequest{Runtime: "docker", Workspace: "site"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.client.DeleteSession(context.Background(), again.SessionID) })
	got := again.Session
	if got.Image != testenv.DockerPythonImage || got.Resources == nil || got.Resources.MemoryBytes != 300<<20 || got.Resources.Pids != 77 {
		t.Errorf("a session on the workspace with no settings: image %q, resources %+v; want the last one's", got.Image, got.Resources)
	}
	var out strings.Builder
	if _, err := s.client.ExecSession(ctx, again.SessionID, httpapi.ExecBody{Command: shell("python3 -c 'print(6*7)'")}, func(ch httpapi.ExecChunk) error { out.Write(ch.Bytes()); return nil }); err != nil || out.String() != "42\n" {
		t.Errorf("python3 in the remembered image: %q, %v", out.String(), err)
	}
}

// memoryRuntime is a runtime whose suspend keeps a session's memory, as
// the tests of it run it.
type memoryRuntime struct {
	name    string
	require func(testing.TB)
	// request is the session's: on docker, an image with python3.
	request session.CreateRequest
	// config is the YAML of a server process's configuration file.
	config string
	// edit is an in-process server's configuration.
	edit func(*config.Config)
	// heldNote is what the note of a suspend after a resume says when a
	// process holds a connection to a host socket.
	heldNote string
	// once says a sandbox's memory is kept across its first suspend
	// only: the soak runs on the others.
	once bool
	// runsc is the runsc of a gvisor runtime, for runsc by hand.
	runsc string
	// heldKept: this runsc checkpoints a sandbox whose process holds a
	// connection to a host socket (the runsc of 2025; the connection is
	// lost), and may then fail to checkpoint the restored sandbox (its
	// save of that socket panicked here), keeping the files.
	heldKept bool
}

// memoryRuntimes are gvisor, on Debian's runsc and on the runsc of 2025
// (systrap, an uncompressed image restored in the background), and
// docker under runsc (on an engine with its experimental features on,
// whose checkpoints they need).
var memoryRuntimes = []memoryRuntime{
	{name: "gvisor", require: func(tb testing.TB) { testenv.RequireRunsc(tb) }, request: session.CreateRequest{Runtime: "gvisor"},
		heldNote: "could not be", runsc: "runsc"},
	{name: "gvisor+systrap", require: func(tb testing.TB) { testenv.RequireSystrapRunsc(tb) }, request: session.CreateRequest{Runtime: "gvisor"},
		config: "gvisor:\n  runsc: " + testenv.SystrapRunsc() + "\n", edit: func(c *config.Config) { c.Gvisor.Runsc = testenv.SystrapRunsc() },
		runsc: testenv.SystrapRunsc(), heldKept: true},
	// A container restored from a checkpoint is not checkpointed again
	// (package docker says why): its next suspend keeps its files.
	{name: "docker+runsc", require: testenv.RequireDockerCheckpoints,
		request:  session.CreateRequest{Runtime: "docker", Image: testenv.DockerPythonImage},
		config:   "docker:\n  host: unix://" + testenv.DockerSocket + "\n  runtime: runsc\n",
		edit:     func(c *config.Config) { c.Docker.Runtime = "runsc" },
		heldNote: "restored from a checkpoint", once: true},
}

// args are the flags of a server process on rt.
func (rt memoryRuntime) args(t *testing.T) []string {
	if rt.config == "" {
		return nil
	}
	f := filepath.Join(t.TempDir(), "corral.yaml")
	if err := os.WriteFile(f, []byte(rt.config), 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{"--config", f}
}

// TestSessionKeepsItsMemory: on gvisor, and on docker under runsc, a
// suspend keeps the session's memory and processes: a server holding a
// count in memory and a command printing as it runs are suspended, the
// server is killed with SIGKILL and started again, the session resumed:
// the count goes on from where it was, and the command's output is whole,
// each line once.
func TestSessionKeepsItsMemory(t *testing.T) {
	for _, rt := range memoryRuntimes {
		t.Run(rt.name, func(t *testing.T) {
			t.Parallel()
			rt.require(t)
			keepsItsMemory(t, rt)
		})
	}
}

func keepsItsMemory(t *testing.T, rt memoryRuntime) {
	args := rt.args(t)
	data, srv := startKillable(t, args...)
	ctx := context.Background()
	created, err := srv.client.CreateSession(ctx, rt.request)
	if err != nil {
		t.Fatal(err)
	}
	id := created.SessionID
	sc := srv.client.Sessions()
	if _, err := sc.StartExec(ctx, id, service.SessionCommand{Shell: ballastServer + "0"}); err != nil {
		t.Fatal(err)
	}
	count := func() string { return strconv.Itoa(sessionCount(srv.client, id)) }
	var first string
	waitFor(t, "the counter served", func() bool { first = count(); return first != "0" })
	ticker, err := sc.StartExec(ctx, id, service.SessionCommand{Shell: `i=0; while [ $i -lt 60 ]; do echo tick $i; i=$((i+1)); sleep 0.1; done`})
	if err != nil {
		t.Fatal(err)
	}
	var seen strings.Builder
	waitFor(t, "the ticker's first lines", func() bool {
		seen.Reset()
		sc.ReadExec(ctx, id, ticker, 0, false, func(o service.ExecOutput) error { seen.Write(o.Data); return nil })
		return strings.Contains(seen.String(), "tick 3\n")
	})
	// Asked by a client that goes away at once: begun, the checkpoint is
	// not cut short.
	dropRequest(t, srv.url, http.MethodPost, "/api/sessions/"+id+"/suspend", "")
	waitFor(t, "the suspend its client left", func() bool {
		s, err := srv.client.GetSession(ctx, id)
		return err == nil && s.Status != service.SessionRunning
	})
	if s, err := srv.client.GetSession(ctx, id); err != nil || s.Status != service.SessionSuspended || !s.MemoryKept {
		t.Fatalf("suspend: %+v, %v; want suspended with its memory kept", s, err)
	}
	// Through a kill -9, still suspended with its memory.
	addr := strings.TrimPrefix(srv.url, "http://")
	srv.kill()
	srv = startProcessAt(t, data, addr, "", args...)
	sc = srv.client.Sessions()
	if s, err := srv.client.GetSession(ctx, id); err != nil || s.Status != service.SessionSuspended || !s.MemoryKept {
		t.Fatalf("after a restart: %+v, %v; want suspended, its memory kept", s, err)
	}
	if s, err := sc.Resume(ctx, id); err != nil || s.Status != service.SessionRunning {
		t.Fatalf("resume: %+v, %v", s, err)
	}
	if n1, _ := strconv.Atoi(first); count() != strconv.Itoa(n1+1) {
		t.Errorf("the count after the resume is not the one after %s: its memory was not kept", first)
	}
	// The restored checkpoint is moved aside at the resume and removed by
	// the reaper soon after, not while the resume's caller waits.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ents, _ := os.ReadDir(filepath.Join(data, "run", "sessions", id))
		left := slices.DeleteFunc(ents, func(e os.DirEntry) bool { return !strings.HasPrefix(e.Name(), "checkpoint") })
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the checkpoint 10 s after the resume: %v still there", left)
			break
		}
	}
	var all strings.Builder
	end, err := sc.ReadExec(ctx, id, ticker, 0, true, func(o service.ExecOutput) error { all.Write(o.Data); return nil })
	var want strings.Builder
	for i := range 60 {
		fmt.Fprintf(&want, "tick %d\n", i)
	}
	if err != nil || end == nil || end.ExitCode != 0 || all.String() != want.String() {
		t.Errorf("the command that ran through the suspend: %+v, %v, output %q; want all 60 lines once and exit 0", end, err, all.String())
	}
	var kept []bool
	srv.client.Events(ctx, service.EventsRequest{}, func(e eventstore.Event) error {
		if e.StreamID == session.StreamID(id) && (e.Type == session.EventSuspended || e.Type == session.EventResumed) {
			var p struct {
				MemoryKept bool `json:"memory_kept"`
			}
			json.Unmarshal(e.Data, &p)
			kept = append(kept, p.MemoryKept)
		}
		return nil
	})
	if !slices.Equal(kept, []bool{true, true}) {
		t.Errorf("the stream's suspend and resume say memory kept: %v, want both", kept)
	}
	// A process holding a connection to a host socket (one of the server's,
	// mounted in every sandbox) cannot be checkpointed by Debian's runsc,
	// which ends a sandbox whose checkpoint failed: the suspend says its
	// memory was not kept, and why; its files are, and a command resumes
	// it. The runsc of 2025 checkpoints it (heldKept).
	holder, err := sc.StartExec(ctx, id, service.SessionCommand{Shell: `echo kept > f.txt; exec python3 -c 'import socket, time; s = socket.socket(socket.AF_UNIX); s.connect("` + workerproto.SocketDir + `/` + workerproto.SocketName + `"); print("held", flush=True); time.sleep(600)'`})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the connection held", func() bool {
		var out strings.Builder
		sc.ReadExec(ctx, id, holder, 0, false, func(o service.ExecOutput) error { out.Write(o.Data); return nil })
		return strings.Contains(out.String(), "held")
	})
	if r, err := sc.Suspend(ctx, id); rt.heldKept && (err != nil || !r.MemoryKept || r.Session.Status != service.SessionSuspended) {
		t.Errorf("suspend with a host connection held: %+v, %v; want suspended, its memory kept (this runsc saves it)", r, err)
	} else if !rt.heldKept && (err != nil || r.MemoryKept || r.Session.Status != service.SessionSuspended || !strings.Contains(r.Note, "could not be") || !strings.Contains(r.Note, rt.heldNote)) {
		t.Errorf("suspend with a host connection held: %+v, %v; want suspended, its memory not kept, saying why", r, err)
	}
	var out strings.Builder
	if end, err := srv.client.ExecSession(ctx, id, httpapi.ExecBody{Command: shell("cat f.txt")}, func(ch httpapi.ExecChunk) error { out.Write(ch.Bytes()); return nil }); err != nil || end.ExitCode != 0 || out.String() != "kept\n" {
		t.Errorf("a command after that suspend: %+v, %q, %v; want the file kept", end, out.String(), err)
	}
	// Its sandbox is a fresh one, whose memory a suspend keeps again;
	// where the held connection was saved, the restored one, which this
	// runsc may not checkpoint again: the answer says which.
	if r, err := sc.Suspend(ctx, id); rt.heldKept && (err != nil || r.Session.Status != service.SessionSuspended || r.MemoryKept == strings.Contains(r.Note, "could not be")) {
		t.Errorf("a suspend of the restored sandbox: %+v, %v; want suspended, its note saying whether its memory was kept", r, err)
	} else if !rt.heldKept && (err != nil || !r.MemoryKept) {
		t.Errorf("a suspend of the fresh sandbox: %+v, %v; want its memory kept", r, err)
	}
	if s, err := sc.Resume(ctx, id); err != nil || s.Status != service.SessionRunning {
		t.Errorf("its resume: %+v, %v", s, err)
	}
	if _, err := srv.client.DeleteSession(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(data, "run", "sessions", id, "checkpoint")); !os.IsNotExist(err) {
		t.Errorf("the session's checkpoint after its end: %v", err)
	}
}

// mustRun runs cmd with sh -c in session id through c and answers its
// output; a command that fails fails the test.
func mustRun(tb testing.TB, c *httpapi.Client, id, cmd string) string {
	tb.Helper()
	var out strings.Builder
	end, err := c.ExecSession(context.Background(), id, httpapi.ExecBody{Command: shell(cmd)}, func(ch httpapi.ExecChunk) error { out.Write(ch.Bytes()); return nil })
	if err != nil || end.ExitCode != 0 {
		tb.Fatalf("%s in %s: %+v, %v: %s", cmd, id, end, err, out.String())
	}
	return out.String()
}

// TestSessionFork: five forks of a session with 100 MiB of files each
// see the source's files as they were (byte for byte, executable bits and
// links kept, a link out of the tree copied as a link, never followed),
// write without touching each other or the source, and run as sessions
// of their own; the answer and the source's stream say what was kept.
func TestSessionFork(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	ctx := context.Background()
	src := mustCreateSession(t, s.client)
	sc := s.client.Sessions()
	run := func(id, cmd string) string { t.Helper(); return mustRun(t, s.client, id, cmd) }
	run(src.SessionID, `mkdir data && for i in $(seq 1 20); do head -c 5242880 /dev/urandom > data/f$i; done && printf '#!/bin/sh\necho hi\n' > run.sh && chmod +x run.sh && ln -s /etc/passwd out && mkfifo pipe && sha256sum data/* run.sh > sums`)
	if _, err := sc.StartExec(ctx, src.SessionID, service.SessionCommand{Shell: "sleep 300"}); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.Fork(ctx, src.SessionID, session.MaxForks+1); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a fork of %d: %v, want refused", session.MaxForks+1, err)
	}
	r, err := sc.Fork(ctx, src.SessionID, 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Forks) != 5 || r.MemoryKept || r.Note == "" || r.Bytes != 100<<20+int64(len("#!/bin/sh\necho hi\n"))+int64(len(run(src.SessionID, "cat sums"))) || len(r.Skipped) != 1 || r.Skipped[0] != "pipe" {
		t.Fatalf("fork: %d forks, %d bytes, skipped %v, memory kept %v, note %q", len(r.Forks), r.Bytes, r.Skipped, r.MemoryKept, r.Note)
	}
	for i, f := range r.Forks {
		if f.Session.ForkedFrom != src.SessionID || f.Session.Status != service.SessionRunning || f.Token == "" || f.Token == src.Token {
			t.Errorf("fork %d: %+v", i, f)
		}
		// Its own token reaches it.
		if _, err := s.client.WithToken(f.Token).ExecSession(ctx, f.SessionID, httpapi.ExecBody{Command: shell("true")}, func(httpapi.ExecChunk) error { return nil }); err != nil {
			t.Errorf("fork %d's own token: %v", i, err)
		}
		if got := run(f.SessionID, "sha256sum -c --quiet sums && ./run.sh && readlink out && ls pipe 2>&1 || true; pgrep -x sleep || echo no-sleep"); !strings.HasPrefix(got, "hi\n/etc/passwd\n") || !strings.HasSuffix(got, "no-sleep\n") {
			t.Errorf("fork %d sees %q; want the source's files, its script runnable, its link a link, no FIFO and none of its processes", i, got)
		}
		fi, err := os.Lstat(filepath.Join(s.data, "sessions", f.SessionID, "out"))
		if err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("fork %d's copy of the link: %v, %v; want a link", i, fi, err)
		}
		run(f.SessionID, "echo "+f.SessionID+" > mine && echo changed >> data/f1")
	}
	run(src.SessionID, "echo source > mine")
	if got := run(src.SessionID, "cat mine; sha256sum -c --quiet sums && echo intact"); got != "source\nintact\n" {
		t.Errorf("the source after its forks wrote: %q", got)
	}
	for i, f := range r.Forks {
		if got := run(f.SessionID, "cat mine"); got != f.SessionID+"\n" {
			t.Errorf("fork %d reads %q from its own file", i, got)
		}
	}
	var forkedEv []string
	s.client.Events(ctx, service.EventsRequest{}, func(e eventstore.Event) error {
		if e.StreamID == session.StreamID(src.SessionID) && e.Type == session.EventForked {
			var p struct {
				Forks []string `json:"forks"`
			}
			json.Unmarshal(e.Data, &p)
			forkedEv = append(forkedEv, p.Forks...)
		}
		return nil
	})
	if len(forkedEv) != 5 {
		t.Errorf("the source's stream names forks %v, want the 5", forkedEv)
	}
}

// TestSessionForkKeepsMemory: on gvisor, five forks of a running session
// with 100 MiB of files, a counter served from its memory and a command
// printing as it runs each start from the source as it was: the count
// goes on from where the source's was, the files match, and the command
// runs on in every fork, whose output (read under the fork's id) holds
// every line once, byte for byte. Each fork's agent attaches as the fork
// (its commands write in its directory), forks and source write without
// touching each other, and the source, paused for the snapshot, runs on.
func TestSessionForkKeepsMemory(t *testing.T) {
	for _, rt := range memoryRuntimes {
		if !strings.HasPrefix(rt.name, "gvisor") {
			continue
		}
		t.Run(rt.name, func(t *testing.T) {
			t.Parallel()
			rt.require(t)
			forkKeepsMemory(t, rt)
		})
	}
}

func forkKeepsMemory(t *testing.T, rt memoryRuntime) {
	data, srv := startKillable(t, rt.args(t)...)
	ctx := context.Background()
	created, first := countingSession(t, srv.client, rt)
	id := created.SessionID
	sc := srv.client.Sessions()
	run := func(id, cmd string) string { t.Helper(); return mustRun(t, srv.client, id, cmd) }
	run(id, `mkdir data && for i in $(seq 1 20); do head -c 5242880 /dev/urandom > data/f$i; done && sha256sum data/* > sums`)
	const lines = 80
	ticker, err := sc.StartExec(ctx, id, service.SessionCommand{Shell: fmt.Sprintf(`i=0; while [ $i -lt %d ]; do echo tick $i; i=$((i+1)); sleep 0.05; done`, lines)})
	if err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for i := range lines {
		fmt.Fprintf(&want, "tick %d\n", i)
	}
	r, err := sc.Fork(ctx, id, 5)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Forks) != 5 || !r.MemoryKept || !strings.Contains(r.Note, "memory") || r.PausedSeconds <= 0 {
		t.Fatalf("fork: %d forks, memory kept %v, paused %vs, note %q", len(r.Forks), r.MemoryKept, r.PausedSeconds, r.Note)
	}
	output := func(id string) string {
		var out strings.Builder
		end, err := sc.ReadExec(ctx, id, ticker, 0, true, func(o service.ExecOutput) error { out.Write(o.Data); return nil })
		if err != nil || end == nil || end.ExitCode != 0 {
			t.Errorf("the ticker in %s: %+v, %v", id, end, err)
		}
		return out.String()
	}
	for i, f := range r.Forks {
		if f.Session.ForkedFrom != id || f.Session.Status != service.SessionRunning || f.Token == "" || f.Token == created.Token {
			t.Errorf("fork %d: %+v", i, f)
		}
		if n := sessionCount(srv.client.WithToken(f.Token), f.SessionID); n != first+1 {
			t.Errorf("fork %d counts %d after the source's %d: its memory is not the source's", i, n, first)
		}
		if got := run(f.SessionID, "sha256sum -c --quiet sums && echo "+f.SessionID+" > mine && echo changed >> data/f1 && echo ok"); got != "ok\n" {
			t.Errorf("fork %d: %q", i, got)
		}
		// What its agent reads its session from is the server's: no
		// command rewrites it, nor makes it name another.
		if got := run(f.SessionID, "{ echo "+id+" > /run/corral/self/session-id || mv /run/corral/self/session-id /tmp/x || rm -f /run/corral/self/session-id; } 2>/dev/null; cat /run/corral/self/session-id"); got != f.SessionID+"\n" {
			t.Errorf("fork %d's self file after a command tried to change it: %q", i, got)
		}
		if b, err := os.ReadFile(filepath.Join(data, "sessions", f.SessionID, "mine")); err != nil || string(b) != f.SessionID+"\n" {
			t.Errorf("fork %d's command wrote %q, %v in its own directory: its agent is not the fork's", i, b, err)
		}
	}
	if n := sessionCount(srv.client, id); n != first+1 {
		t.Errorf("the source counts %d after %d: it did not run on as it was", n, first)
	}
	if got := run(id, "cat mine 2>/dev/null; sha256sum -c --quiet sums && echo intact"); got != "intact\n" {
		t.Errorf("the source after its forks wrote: %q", got)
	}
	for i, f := range append(r.Forks, service.SessionCreated{SessionID: id}) {
		if got := output(f.SessionID); got != want.String() {
			t.Errorf("session %d (%s): the ticker's output is not its lines once each:\n%s", i, f.SessionID, got)
		}
	}
	for i, f := range r.Forks {
		if got := run(f.SessionID, "cat mine"); got != f.SessionID+"\n" {
			t.Errorf("fork %d reads %q from its own file", i, got)
		}
	}
	var ev struct {
		Forks         []string `json:"forks"`
		MemoryKept    bool     `json:"memory_kept"`
		Execs         int      `json:"execs_inherited"`
		PausedSeconds float64  `json:"paused_seconds"`
	}
	srv.client.Events(ctx, service.EventsRequest{}, func(e eventstore.Event) error {
		if e.StreamID == session.StreamID(id) && e.Type == session.EventForked {
			json.Unmarshal(e.Data, &ev)
		}
		return nil
	})
	if len(ev.Forks) != 5 || !ev.MemoryKept || ev.Execs != 2 || ev.PausedSeconds <= 0 {
		t.Errorf("the source's session_forked: %+v; want 5 forks, memory kept, 2 commands inherited, the pause", ev)
	}
	if left, _ := filepath.Glob(filepath.Join(data, "run", "sessions", "*", "fork-*")); len(left) != 0 {
		t.Errorf("snapshots left after the fork: %v", left)
	}
}

// TestSessionForkOfSuspended: on gvisor, a fork of a session suspended
// with its memory starts from that memory, and the source stays
// suspended, resuming as it was.
func TestSessionForkOfSuspended(t *testing.T) {
	rt := memoryRuntimes[0]
	rt.require(t)
	t.Parallel()
	_, srv := startKillable(t, rt.args(t)...)
	ctx := context.Background()
	created, first := countingSession(t, srv.client, rt)
	id := created.SessionID
	if sus, err := srv.client.Sessions().Suspend(ctx, id); err != nil || !sus.MemoryKept {
		t.Fatalf("suspend: %+v, %v", sus, err)
	}
	r, err := srv.client.Sessions().Fork(ctx, id, 1)
	if err != nil || len(r.Forks) != 1 || !r.MemoryKept || r.PausedSeconds != 0 {
		t.Fatalf("fork of the suspended session: %+v, %v; want one fork of its memory, no pause", r, err)
	}
	if n := sessionCount(srv.client, r.Forks[0].SessionID); n != first+1 {
		t.Errorf("the fork counts %d after the source's %d", n, first)
	}
	if s, err := srv.client.GetSession(ctx, id); err != nil || s.Status != service.SessionSuspended || !s.MemoryKept {
		t.Fatalf("the source after its fork: %+v, %v; want suspended with its memory", s, err)
	}
	if n := sessionCount(srv.client, id); n != first+1 {
		t.Errorf("the source, resumed by a command, counts %d after %d", n, first)
	}
}

// TestSessionForkServerKilledInSnapshot: on gvisor, a server killed with
// SIGKILL once a running session is suspended for its forks' snapshot,
// before it is resumed or a fork is made, leaves the session suspended
// with its memory, which resumes as it was, and no fork; the next server
// removes the snapshot.
func TestSessionForkServerKilledInSnapshot(t *testing.T) {
	rt := memoryRuntimes[0]
	rt.require(t)
	t.Parallel()
	data, args := testenv.TempDir(t), rt.args(t)
	c, id, first := crashingCounter(t, rt, data, sandbox.CrashForkSnapshot, args)
	ctx := context.Background()
	if _, err := c.client.Sessions().Fork(ctx, id, 2); err == nil {
		t.Fatal("the fork answered: the server did not die at its crash point")
	}
	<-c.exited
	if left, _ := filepath.Glob(filepath.Join(data, "run", "sessions", id, "fork-*")); len(left) != 1 {
		t.Fatalf("the snapshots after the kill: %v; want the one the fork took", left)
	}
	srv := startProcess(t, data, args...)
	if left, _ := filepath.Glob(filepath.Join(data, "run", "sessions", id, "fork-*")); len(left) != 0 {
		t.Errorf("the snapshots after the restart: %v; want none", left)
	}
	if ss, err := srv.client.ListSessions(ctx); err != nil || len(ss) != 1 || ss[0].ID != id || ss[0].Status != service.SessionSuspended || !ss[0].MemoryKept {
		t.Fatalf("sessions after the restart: %+v, %v; want the source alone, suspended with its memory", ss, err)
	}
	if _, err := srv.client.Sessions().Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if n := sessionCount(srv.client, id); n != first+1 {
		t.Errorf("the count after the resume is %d, after %d: its memory was not kept", n, first)
	}
}

// crashingCounter starts a server on data with args that dies at crash
// point, and a session of rt's on it serving ballastServer's count; it
// returns the server, the session and its count so far.
func crashingCounter(t *testing.T, rt memoryRuntime, data, point string, args []string) (c *crashing, id string, first int) {
	t.Helper()
	c = startCrashing(t, data, point, args...)
	created, first := countingSession(t, c.client, rt)
	return c, created.SessionID, first
}

// countingSession creates a session of rt's through c serving
// ballastServer's count, and returns it and its count so far.
func countingSession(t *testing.T, c *httpapi.Client, rt memoryRuntime) (created httpapi.SessionCreated, first int) {
	t.Helper()
	created, err := c.CreateSession(context.Background(), rt.request)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Sessions().StartExec(context.Background(), created.SessionID, service.SessionCommand{Shell: ballastServer + "0"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the counter served", func() bool { first = sessionCount(c, created.SessionID); return first != 0 })
	return created, first
}

// TestSessionCheckpointedServerKilled: on gvisor and on docker under
// runsc, a server killed with SIGKILL after a session's checkpoint was
// written whole and before its suspend was recorded leaves the next
// server to record it: the session is found suspended with its memory,
// and resumes as it was.
func TestSessionCheckpointedServerKilled(t *testing.T) {
	for _, rt := range memoryRuntimes {
		t.Run(rt.name, func(t *testing.T) {
			t.Parallel()
			rt.require(t)
			checkpointedServerKilled(t, rt)
		})
	}
}

func checkpointedServerKilled(t *testing.T, rt memoryRuntime) {
	testenv.RequireBwrap(t)
	data, args := testenv.TempDir(t), rt.args(t)
	c, id, first := crashingCounter(t, rt, data, sandbox.CrashCheckpointed, args)
	ctx := context.Background()
	if _, err := c.client.Sessions().Suspend(ctx, id); err == nil {
		t.Fatal("the suspend answered: the server did not die at its crash point")
	}
	<-c.exited
	srv := startProcess(t, data, args...)
	if s, err := srv.client.GetSession(ctx, id); err != nil || s.Status != service.SessionSuspended || !s.MemoryKept {
		t.Fatalf("after the restart: %+v, %v; want suspended with its memory", s, err)
	}
	if _, err := srv.client.Sessions().Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if n := sessionCount(srv.client, id); n != first+1 {
		t.Errorf("the count after the resume is %d, after %d: its memory was not kept", n, first)
	}
	if _, err := srv.client.DeleteSession(ctx, id); err != nil {
		t.Errorf("delete the resumed session: %v", err)
	}
}

// TestSessionForkServerKilled: a server killed with SIGKILL while it
// copies a fork's files (its directory filled, its session not recorded)
// leaves a directory no session names; the next server removes it at its
// start, and the source runs on with its files. On local the fork copies
// files; on gvisor it is a fork of the source's memory, whose snapshot
// and copied command output go too. A fork of four is made two at a time
// (or as many as the CPUs): the kill finds the others under way, and the
// next server removes theirs as well.
func TestSessionForkServerKilled(t *testing.T) {
	for _, rt := range []memoryRuntime{{name: "local", require: func(testing.TB) {}}, memoryRuntimes[0]} {
		for _, count := range []int{1, 4} {
			t.Run(fmt.Sprintf("%s/%d", rt.name, count), func(t *testing.T) {
				t.Parallel()
				rt.require(t)
				forkServerKilled(t, rt, count)
			})
		}
	}
}

func forkServerKilled(t *testing.T, rt memoryRuntime, count int) {
	testenv.RequireBwrap(t)
	data, args := testenv.TempDir(t), rt.args(t)
	c := startCrashing(t, data, sandbox.CrashForkCopied, args...)
	ctx := context.Background()
	created, err := c.client.CreateSession(ctx, rt.request)
	if err != nil {
		t.Fatal(err)
	}
	id := created.SessionID
	if _, err := c.client.ExecSession(ctx, id, httpapi.ExecBody{Command: shell("mkdir -p d && head -c 1048576 /dev/urandom > d/a && echo kept > f.txt")}, func(httpapi.ExecChunk) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := c.client.Sessions().Fork(ctx, id, count); err == nil {
		t.Fatal("the fork answered: the server did not die at its crash point")
	}
	<-c.exited
	dirs := func() []string {
		ents, err := os.ReadDir(filepath.Join(data, "sessions"))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return names
	}
	left := dirs()
	if len(left) < 2 || count == 1 && len(left) != 2 {
		t.Fatalf("the session directories after the kill: %v; want the source's and the copies of the forks under way", left)
	}
	srv := startProcess(t, data, args...)
	if got := dirs(); !slices.Equal(got, []string{id}) {
		t.Errorf("the session directories after the restart: %v; want the source's alone", got)
	}
	if left, _ := filepath.Glob(filepath.Join(data, "run", "sessions", "*", "fork-*")); len(left) != 0 {
		t.Errorf("fork snapshots after the restart: %v; want none", left)
	}
	if runs, _ := os.ReadDir(filepath.Join(data, "run", "sessions")); len(runs) != 1 || runs[0].Name() != id {
		t.Errorf("the sessions' server-side directories after the restart: %v; want the source's alone", runs)
	}
	if ss, err := srv.client.ListSessions(ctx); err != nil || len(ss) != 1 || ss[0].ID != id {
		t.Errorf("sessions after the restart: %+v, %v; want the source alone", ss, err)
	}
	var out strings.Builder
	if end, err := srv.client.ExecSession(ctx, id, httpapi.ExecBody{Command: shell("cat f.txt")}, func(ch httpapi.ExecChunk) error { out.Write(ch.Bytes()); return nil }); err != nil || end.ExitCode != 0 || out.String() != "kept\n" {
		t.Errorf("the source after the restart: %+v, %q, %v", end, out.String(), err)
	}
	if _, err := os.Stat(filepath.Join(data, "run", "sessions", id, "making")); !os.IsNotExist(err) {
		t.Errorf("the source's making mark: %v; want it gone once recorded", err)
	}
}

// TestSessionEndStopsItsCommands: a session's end gives its running
// commands SIGTERM and limits.stop_grace before it kills them, as a
// task's cancel gives its agent: a command that cleans up on SIGTERM (a
// server flushing its files) does, on each runtime. The session works in
// a workspace, which outlives its delete. They were killed at once.
func TestSessionEndStopsItsCommands(t *testing.T) {
	for _, rt := range sessionRuntimes {
		t.Run(rt.name, func(t *testing.T) {
			t.Parallel()
			rt.require(t)
			s := MustStart(t, func(c *config.Config) {
				rt.config(t)(c)
				c.Limits.StopGrace = config.Duration(20 * time.Second)
			})
			ctx := context.Background()
			if _, err := s.client.CreateProject(ctx, service.CreateProjectRequest{Name: "app"}); err != nil {
				t.Fatal(err)
			}
			created, err := s.client.CreateSession(ctx, session.CreateRequest{Runtime: rt.runtime, Workspace: "app"})
			if err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(s.data, "projects", "app")
			if _, err := s.client.Sessions().StartExec(ctx, created.SessionID, service.SessionCommand{
				Shell: "trap 'echo flushed > flushed; exit 0' TERM; touch up; while :; do sleep 0.1; done",
			}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the command up", func() bool {
				_, err := os.Stat(filepath.Join(dir, "up"))
				return err == nil
			})
			start := time.Now()
			if _, err := s.client.DeleteSession(ctx, created.SessionID); err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(filepath.Join(dir, "flushed")); err != nil || string(b) != "flushed\n" {
				t.Errorf("after the delete the command's SIGTERM handler wrote %q, %v; want it run", b, err)
			}
			// It ended on its SIGTERM, well within the grace.
			if took := time.Since(start); took > 15*time.Second {
				t.Errorf("the delete took %v", took)
			}
		})
	}
}

// TestSessionDeleteServerKilledInGrace: a server killed with SIGKILL
// while a session's delete waits out its commands' stop grace (the
// sandbox has had its SIGTERM; the end is not recorded) leaves nothing
// stuck. The command's SIGTERM handler still runs to its end, the exec
// agent then ends and its sandbox with it, and the next server records
// the session's end, saying its sandbox ended, with no sandbox left.
func TestSessionDeleteServerKilledInGrace(t *testing.T) {
	t.Parallel()
	data, srv := startKillable(t)
	ctx := context.Background()
	created := mustCreateSession(t, srv.client)
	dir := filepath.Join(data, "sessions", created.SessionID)
	// On SIGTERM the command takes 3 s to clean up: the server dies in
	// between.
	if _, err := srv.client.Sessions().StartExec(ctx, created.SessionID, service.SessionCommand{
		Shell: "trap 'touch got-term; sleep 3; echo flushed > flushed; exit 0' TERM; touch up; while :; do sleep 0.1; done",
	}); err != nil {
		t.Fatal(err)
	}
	exists := func(name string) func() bool {
		return func() bool { _, err := os.Stat(filepath.Join(dir, name)); return err == nil }
	}
	waitFor(t, "the command up", exists("up"))
	deleted := make(chan error, 1)
	go func() {
		_, err := srv.client.DeleteSession(ctx, created.SessionID)
		deleted <- err
	}()
	waitFor(t, "the command's SIGTERM", exists("got-term"))
	srv.kill()
	if err := <-deleted; err == nil {
		t.Fatal("the delete answered before the server was killed: its grace was not under way")
	}
	srv = startProcess(t, data)
	waitFor(t, "the session's end recorded by the next server", func() bool {
		s, err := srv.client.GetSession(ctx, created.SessionID)
		return err == nil && s.Status == service.SessionEnded
	})
	if b, err := os.ReadFile(filepath.Join(dir, "flushed")); err != nil || string(b) != "flushed\n" {
		t.Errorf("the command's SIGTERM handler wrote %q, %v; want it run to its end", b, err)
	}
	if _, err := os.Stat(filepath.Join(data, "run", "local", created.SessionID)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the ended session's sandbox state is left: %v", err)
	}
	if processMentioning(created.SessionID) {
		t.Errorf("a process of the ended session's sandbox is left")
	}
	// A delete now, the client's retry, answers that it has ended.
	if _, err := srv.client.DeleteSession(ctx, created.SessionID); err != nil && !strings.Contains(err.Error(), "ended") {
		t.Errorf("the delete again: %v", err)
	}
}
