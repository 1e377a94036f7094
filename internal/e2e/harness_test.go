//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/app"
	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/cgroups"
	"github.com/corral-dev/corral/internal/sandbox/docker"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/session"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// corralBin is the corral binary built once for the package, with
// corral-worker beside it for the sandboxes; the crash tests run corral
// as the server.
var corralBin string

func TestMain(m *testing.M) { testenv.MainWithCorral(m, &corralBin) }

// server is a Corral server running in the test process on 127.0.0.1:0.
type server struct {
	app    *app.App
	client *httpapi.Client
	url    string
	data   string
	token  string // the API token, "" when the server asks for none
}

// MustStart starts a server on a fresh data root with cfg changed by edit.
func MustStart(t *testing.T, edit func(*config.Config)) *server {
	t.Helper()
	return MustStartEnv(t, []string{}, edit)
}

// MustStartEnv is MustStart with the environment the configuration reads.
func MustStartEnv(t *testing.T, environ []string, edit func(*config.Config)) *server {
	t.Helper()
	return startServer(t, environ, nil, edit)
}

// startServer starts a server for any test or benchmark: environ is what
// the configuration reads, now the server's clock (nil: the real one),
// edit changes the configuration.
func startServer(tb testing.TB, environ []string, now func() time.Time, edit func(*config.Config)) *server {
	tb.Helper()
	testenv.RequireBwrap(tb)
	cfg := testConfig(tb, environ, testenv.TempDir(tb))
	cfg.Limits.StopGrace = config.Duration(2 * time.Second)
	// Tasks on the docker runtime run the tests' image from the tests'
	// engine.
	cfg.AIWorker.AICoderImage = testenv.DockerImage
	cfg.Docker.Host = "unix://" + testenv.DockerSocket
	if edit != nil {
		edit(cfg)
	}
	if err := cfg.Validate(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { killSandboxes(tb, cfg.Data) })
	a, _ := runApp(tb, cfg, now, func(a *app.App) {
		if err := a.DestroySandboxes(context.Background()); err != nil {
			tb.Errorf("destroy the test's sandboxes: %v", err)
		}
	})
	url := "http://" + a.Addr()
	return &server{app: a, client: httpapi.NewClient(url, a.Token()), url: url, data: cfg.Data, token: a.Token()}
}

// testConfig is the configuration environ makes, for a server on a free
// loopback port with data as its data root.
func testConfig(tb testing.TB, environ []string, data string) *config.Config {
	tb.Helper()
	cfg, err := config.Load(config.LoadOptions{Environ: environ})
	if err != nil {
		tb.Fatal(err)
	}
	cfg.Listen = "127.0.0.1:0"
	cfg.Data = data
	return cfg
}

// runApp runs a server in this process with cfg and the clock now (nil:
// the real one), and returns once it answers. The returned stop, called
// when the test ends if not before, ends it, then runs after (unless nil)
// and closes it.
func runApp(tb testing.TB, cfg *config.Config, now func() time.Time, after func(*app.App)) (*app.App, func()) {
	tb.Helper()
	log := slog.New(slog.NewTextHandler(testWriter{tb}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, cancel := context.WithCancel(context.Background())
	a, err := app.New(ctx, cfg, log, app.Options{Binary: corralBin, Now: now})
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				tb.Errorf("server ended with %v", err)
			}
			if after != nil {
				after(a)
			}
			a.Close()
		})
	}
	tb.Cleanup(stop)
	waitHealthy(tb, "http://"+a.Addr())
	return a, stop
}

// killSandboxes stops sandboxes a test left running: workers outlive the
// server by design, so a test must end them itself, and wait for them to
// be gone before its temporary directory is removed under them. Every
// sandbox of the local and gvisor runtimes goes (tasks', sessions', warm
// ones), with its cgroups (those its state names, and those named after
// it under the default parent, as the tests' servers use it), which
// stayed for good after a killed server.
func killSandboxes(tb testing.TB, data string) {
	// The docker runtime's containers, by the instance label of a server
	// on data: a test that does not end its sessions (a crash test's)
	// leaves them running, with the shim of a restored one.
	if _, err := os.Stat(filepath.Join(data, "run", docker.Name)); err == nil {
		engine := []string{"-H", "unix://" + testenv.DockerSocket}
		out, _ := exec.Command("docker", append(engine, "ps", "-aq", "--filter", "label="+sandbox.LabelInstance+"="+docker.InstanceOf(data))...).Output()
		if ids := strings.Fields(string(out)); len(ids) > 0 {
			if out, err := exec.Command("docker", append(append(engine, "rm", "-f"), ids...)...).CombinedOutput(); err != nil {
				tb.Logf("remove the containers of %s: %v %s", data, err, out)
			}
		}
	}
	cg, _ := cgroups.Detect("/sys/fs/cgroup", "corral")
	for _, rt := range []string{"local", "gvisor"} {
		var ids []string
		for _, dir := range []string{filepath.Join(data, "run", rt), filepath.Join(data, "run", rt, "_warm")} {
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				// Sandboxes' only: a name is matched against every process's
				// command line (pkill -f), and runsc's own directory is
				// run/gvisor/runsc.
				if e.IsDir() && (task.ValidID(e.Name()) || session.ValidID(e.Name()) || strings.HasPrefix(e.Name(), "warm-")) {
					ids = append(ids, e.Name())
				}
			}
		}
		for _, id := range ids {
			exec.Command("pkill", "-KILL", "-f", id).Run()
			// A task's sandbox that was warm keeps the warm one's cgroups:
			// its state names them.
			var st struct {
				Cgroups []string `json:"cgroups"`
			}
			if b, err := os.ReadFile(filepath.Join(data, "run", rt, id, "state.json")); err == nil {
				json.Unmarshal(b, &st)
			}
			if cg != nil {
				st.Cgroups = append(st.Cgroups, cg.Dirs(id)...)
			}
			if err := cgroups.KillAndRemove(st.Cgroups); err != nil {
				tb.Logf("sandbox %s: %v", id, err)
			}
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				if exec.Command("pgrep", "-f", id).Run() != nil {
					break // no process names it any more
				}
			}
		}
	}
}

func waitHealthy(tb testing.TB, url string) {
	tb.Helper()
	// A deadline, not a speed: a server restarted after a kill is healthy
	// once it has reconciled, which destroys what the one before left one
	// by one (a pod under gVisor took 3 s of that at a load of 11).
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	tb.Fatalf("server at %s never became healthy within 60s", url)
}

// testWriter sends the server's log to the test's log.
type testWriter struct{ tb testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// spawn spawns a command-agent task running argv.
func (s *server) spawn(t *testing.T, desc string, argv ...string) task.Task {
	t.Helper()
	tk, _, err := s.client.Spawn(context.Background(), service.SpawnRequest{TaskDescription: desc, Agent: "command", Command: argv})
	if err != nil {
		t.Fatalf("spawn %q: %v", desc, err)
	}
	return tk
}

// wait waits for a task to end and returns its result.
func (s *server) wait(t testing.TB, id string, within time.Duration, files ...string) service.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within+5*time.Second)
	defer cancel()
	res, err := s.client.Result(ctx, service.ResultRequest{TaskID: id, Wait: within, IncludeFileContents: files})
	if err != nil {
		t.Fatalf("result of %s: %v", id, err)
	}
	if !res.Done {
		s.logTask(t, id)
		t.Fatalf("task %s did not end within %s: status %s", id, within, res.Status)
	}
	return res
}

// logTask logs what a task shows of itself: its events (the type and the
// start of the data of each) and the last 4 KiB of each file in its logs
// directory (the agent's transcript and stderr), so that a run that hangs
// or goes wrong in CI says where.
func (s *server) logTask(t testing.TB, id string) {
	t.Helper()
	err := s.client.Events(context.Background(), service.EventsRequest{TaskID: id}, func(e eventstore.Event) error {
		data := string(e.Data)
		if len(data) > 300 {
			data = data[:300] + "..."
		}
		t.Logf("event %d %s %s: %s", e.Position, e.RecordedAt.Format(time.RFC3339Nano), e.Type, data)
		return nil
	})
	if err != nil {
		t.Logf("events of %s: %v", id, err)
	}
	logs := filepath.Join(s.data, "tasks", id, "logs")
	entries, err := os.ReadDir(logs)
	if err != nil {
		t.Logf("logs of %s: %v", id, err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(logs, e.Name()))
		if err != nil {
			t.Logf("%s: %v", e.Name(), err)
			continue
		}
		t.Logf("%s (%d bytes), its end:\n%s", e.Name(), len(b), b[max(0, len(b)-4096):])
	}
}

// waitSuccess waits for a task to end as wait does, and stops the test
// unless it succeeded.
func (s *server) waitSuccess(t testing.TB, id string, within time.Duration, files ...string) service.Result {
	t.Helper()
	res := s.wait(t, id, within, files...)
	if res.Status != task.Success {
		t.Fatalf("task %s ended %s: %s; want success", id, res.Status, res.ErrorMessage)
	}
	return res
}

// waitStatus polls until a task reaches status.
func (s *server) waitStatus(t *testing.T, id string, want task.Status, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		tk, err := s.client.Get(context.Background(), id)
		if err == nil && tk.Status == want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	tk, _ := s.client.Get(context.Background(), id)
	t.Fatalf("task %s: status %s, want %s within %s", id, tk.Status, want, within)
}

// mustWriteWorkspace writes data to path in the shared workspace.
func (s *server) mustWriteWorkspace(t testing.TB, path string, data []byte) {
	t.Helper()
	if _, err := s.client.WriteWorkspace(context.Background(), path, data); err != nil {
		t.Fatal(err)
	}
}

// mustSpawn spawns the task req asks for through c.
func mustSpawn(t testing.TB, c *httpapi.Client, req service.SpawnRequest) task.Task {
	t.Helper()
	tk, _, err := c.Spawn(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// mustCreateSession creates a session through c.
func mustCreateSession(t *testing.T, c *httpapi.Client) httpapi.SessionCreated {
	t.Helper()
	created, err := c.CreateSession(context.Background(), session.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return created
}

// do sends a raw request, with the API token if there is one, and returns
// the status and body.
func (s *server) do(t *testing.T, method, path, contentType string, body io.Reader) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, s.url+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return send(t, req)
}

// send sends req and returns the status and body.
func send(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// freeLoopbackAddr returns a 127.0.0.1 address with a port nothing listens
// on, for a server the test starts there: freeAddr's.
func freeLoopbackAddr(t testing.TB) string { return freeAddr(t, "127.0.0.1") }

// freeAddr returns an address on host with a port nothing listens on, for
// a server a test starts there and may start again there after killing
// it. The port is below the kernel's ephemeral range, where a port a
// listener on :0 is given lies: one of those can be given next to a
// connection's own end, and a server started again on it failed with
// "address already in use" (TestKill9AtEachPoint/exited, 2026-12-02). It
// is below Kubernetes' NodePorts too (30000 and up), and never one this
// process handed out before.
func freeAddr(t testing.TB, host string) string {
	t.Helper()
	const lowest, nodePorts = 10000, 30000
	top := nodePorts
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				top = min(top, n)
			}
		}
	}
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 1000 {
		if top <= lowest {
			break
		}
		port := lowest + rand.IntN(top-lowest)
		if portsGiven[port] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			continue
		}
		l.Close()
		portsGiven[port] = true
		return l.Addr().String()
	}
	t.Fatalf("no free port on %s between %d and %d", host, lowest, top)
	return ""
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// processRunning reports whether a process whose argv is exactly argv runs.
func processRunning(argv ...string) bool {
	want := strings.Join(argv, "\x00") + "\x00"
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && string(b) == want {
			return true
		}
	}
	return false
}

// resultReq asks for a task's result with some output files' contents.
func resultReq(id string, files ...string) service.ResultRequest {
	return service.ResultRequest{TaskID: id, IncludeFileContents: files}
}
