//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/app"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/sandbox/hostproc"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestDestroySandboxesLeavesNothing: a throwaway server (the bench, a
// test) stopped with a task still running destroys its sandbox — the
// processes and the cgroups named after the task — so nothing of it
// outlives the server.
func TestDestroySandboxesLeavesNothing(t *testing.T) {
	testenv.RequireBwrap(t)
	t.Parallel()
	cfg := testConfig(t, []string{}, testenv.TempDir(t))
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	a, err := app.New(ctx, cfg, slog.New(slog.NewTextHandler(testWriter{t}, nil)), app.Options{Binary: corralBin})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	served := make(chan error, 1)
	go func() { served <- a.Run(ctx) }()
	runErr := sync.OnceValue(func() error { return <-served })
	// Whatever fails below, the sandbox does not outlive the test: a
	// leftover would run on into the next test (-count) and fail it.
	defer func() {
		stop()
		runErr()
		a.DestroySandboxes(context.Background())
	}()
	url := "http://" + a.Addr()
	waitHealthy(t, url)
	s := &server{app: a, client: httpapi.NewClient(url, a.Token()), url: url, data: cfg.Data}
	tk := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "long", Agent: "command", Command: []string{"sleep", "60.02"}})
	s.waitStatus(t, tk.ID, task.Running, 20*time.Second)
	var st struct {
		Cgroups []string `json:"cgroups"`
	}
	b, err := os.ReadFile(filepath.Join(cfg.Data, "run", "local", tk.ID, "state.json"))
	if err != nil || json.Unmarshal(b, &st) != nil || len(st.Cgroups) == 0 {
		t.Fatalf("sandbox state: %v %s", err, b)
	}
	_, pidNS := localSandboxPID(t, cfg.Data, tk.ID)
	// Running means the sandbox started, not that the worker has started
	// the agent yet (a loaded machine takes a while): the server stops
	// once the agent runs.
	agent := []string{"sleep", "60.02"}
	for deadline := time.Now().Add(20 * time.Second); !runningIn(pidNS, agent...); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the task's agent never started")
		}
	}
	stop()
	if err := runErr(); err != nil {
		t.Fatal(err)
	}
	if !runningIn(pidNS, agent...) {
		t.Fatal("the worker died with the server; the test proves nothing")
	}
	if err := a.DestroySandboxes(context.Background()); err != nil {
		t.Fatal(err)
	}
	if runningIn(pidNS, agent...) {
		t.Error("the task's process outlived DestroySandboxes")
	}
	for _, d := range st.Cgroups {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("cgroup %s left behind: %v", d, err)
		}
	}
}

// runningIn reports whether a process whose argv is exactly argv runs in
// the pid namespace ns (a sandbox's): on a shared machine other tests run
// the same command in their own sandboxes.
// localSandboxPID returns the pid (on the host) of local sandbox id's
// pid 1 and its pid namespace, as bwrap reported them in the sandbox's
// status.jsonl, waiting for bwrap to report them.
func localSandboxPID(tb testing.TB, data, id string) (pid int, pidNS uint64) {
	tb.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile(filepath.Join(data, "run", "local", id, "status.jsonl"))
		for _, line := range strings.Split(string(b), "\n") {
			var st struct {
				ChildPID int    `json:"child-pid"`
				PIDNS    uint64 `json:"pid-namespace"`
			}
			if json.Unmarshal([]byte(line), &st) == nil && st.ChildPID != 0 && st.PIDNS != 0 {
				return st.ChildPID, st.PIDNS
			}
		}
	}
	tb.Fatalf("bwrap never reported sandbox %s's pid 1", id)
	return 0, 0
}

func runningIn(ns uint64, argv ...string) bool {
	want := strings.Join(argv, "\x00") + "\x00"
	for _, pid := range hostproc.PidsInNamespace(ns) {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if err == nil && string(b) == want {
			return true
		}
	}
	return false
}

// TestFailedDestroyTriedAgain: a local sandbox whose destroy fails after
// its task's end (here a cgroup the test made inside the sandbox's, which
// the removal cannot take) is kept as it is, then destroyed again while
// the server runs once what held it is gone: its cgroups, its state dir
// and its identity's lease go, its task's directory is the server's
// again, and the task's events say both.
func TestFailedDestroyTriedAgain(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	tk := s.spawn(t, "held", "sh", "-c", "until [ -e /task/go ]; do sleep 0.05; done")
	s.waitStatus(t, tk.ID, task.Running, 30*time.Second)
	stateDir := filepath.Join(s.data, "run", "local", tk.ID)
	var st struct {
		Cgroups []string `json:"cgroups"`
	}
	if b, err := os.ReadFile(filepath.Join(stateDir, "state.json")); err != nil || json.Unmarshal(b, &st) != nil || len(st.Cgroups) == 0 {
		t.Fatalf("sandbox state: %v %s", err, b)
	}
	hold := filepath.Join(st.Cgroups[0], "held-by-test")
	if err := os.Mkdir(hold, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(hold)
	taskDir := filepath.Join(s.data, "tasks", tk.ID)
	if err := os.WriteFile(filepath.Join(taskDir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s.waitSuccess(t, tk.ID, 60*time.Second)
	has := func(typ string) bool { return slices.Contains(eventTypes(t, s.client, tk.ID), typ) }
	waitFor(t, "the failed destroy's record", func() bool { return has(task.EventSandboxDestroyFailed) })
	owner := func() uint32 {
		fi, err := os.Stat(taskDir)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Uid
	}
	if _, err := os.Stat(stateDir); err != nil || owner() == 0 || has(task.EventSandboxDestroyed) {
		t.Fatalf("after the failed destroy: state dir %v, task directory's owner %d, events %v; want the sandbox kept whole", err, owner(), eventTypes(t, s.client, tk.ID))
	}
	if err := os.Remove(hold); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the destroy's record", func() bool { return has(task.EventSandboxDestroyed) })
	if _, err := os.Stat(stateDir); !os.IsNotExist(err) {
		t.Errorf("state dir after the destroy: %v", err)
	}
	for _, d := range st.Cgroups {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("cgroup %s after the destroy: %v", d, err)
		}
	}
	if uid := owner(); uid != 0 {
		t.Errorf("the task's directory is uid %d's after the destroy, want the server's", uid)
	}
	leases, _ := os.ReadDir(filepath.Join(s.data, "run", "identities"))
	for _, l := range leases {
		if b, _ := os.ReadFile(filepath.Join(s.data, "run", "identities", l.Name())); strings.Contains(string(b), tk.ID) {
			t.Errorf("identity %s still leased to the task's sandbox", l.Name())
		}
	}
}
