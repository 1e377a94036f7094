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
	cgs := localCgroups(t, cfg.Data, tk.ID)
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
	for _, d := range cgs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("cgroup %s left behind: %v", d, err)
		}
	}
}

// localCgroups returns the cgroups local sandbox id's state names, and
// fails the test if it names none.
func localCgroups(t *testing.T, data, id string) []string {
	t.Helper()
	var st struct {
		Cgroups []string `json:"cgroups"`
	}
	b, err := os.ReadFile(filepath.Join(data, "run", "local", id, "state.json"))
	if err != nil || json.Unmarshal(b, &st) != nil || len(st.Cgroups) == 0 {
		t.Fatalf("sandbox %s's state: %v %s", id, err, b)
	}
	return st.Cgroups
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
// its task's or its session's end (here a cgroup the test made inside the
// sandbox's, which the removal cannot take) is kept as it is, then
// destroyed again while the server runs once what held it is gone: its
// cgroups, its state dir and its identity's lease go, and its directory
// is the server's again; a task's events say both.
func TestFailedDestroyTriedAgain(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	t.Run("task", func(t *testing.T) {
		t.Parallel()
		tk := s.spawn(t, "held", "sh", "-c", "until [ -e /task/go ]; do sleep 0.05; done")
		s.waitStatus(t, tk.ID, task.Running, 30*time.Second)
		dir := filepath.Join(s.data, "tasks", tk.ID)
		held := holdSandbox(t, s.data, tk.ID, dir)
		if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		s.waitSuccess(t, tk.ID, 60*time.Second)
		has := func(typ string) bool { return slices.Contains(eventTypes(t, s.client, tk.ID), typ) }
		waitFor(t, "the failed destroy's record", func() bool { return has(task.EventSandboxDestroyFailed) })
		held.check(t)
		if has(task.EventSandboxDestroyed) {
			t.Fatalf("destroyed while held: %v", eventTypes(t, s.client, tk.ID))
		}
		held.release(t)
		waitFor(t, "the destroy's record", func() bool { return has(task.EventSandboxDestroyed) })
		held.gone(t)
	})
	t.Run("session", func(t *testing.T) {
		t.Parallel()
		sess := mustCreateSession(t, s.client)
		// Its directory goes with its end (sessions' retention), destroyed
		// or not: only its sandbox is looked at.
		held := holdSandbox(t, s.data, sess.SessionID, "")
		if _, err := s.client.DeleteSession(context.Background(), sess.SessionID); err != nil {
			t.Fatal(err)
		}
		held.check(t)
		held.release(t)
		waitFor(t, "the session's sandbox destroyed", func() bool {
			_, err := os.Stat(held.stateDir)
			return os.IsNotExist(err)
		})
		held.gone(t)
	})
}

// heldSandbox is a local sandbox whose cgroup a cgroup of the test's,
// made inside it, holds: its destroy fails until release.
type heldSandbox struct {
	data, id, stateDir, dir, hold string
	cgroups                       []string
}

// holdSandbox holds local sandbox id's first cgroup; dir is the directory
// it was given ("": not looked at).
func holdSandbox(t *testing.T, data, id, dir string) *heldSandbox {
	t.Helper()
	h := &heldSandbox{data: data, id: id, stateDir: filepath.Join(data, "run", "local", id), dir: dir}
	h.cgroups = localCgroups(t, data, id)
	h.hold = filepath.Join(h.cgroups[0], "held-by-test")
	if err := os.Mkdir(h.hold, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(h.hold) })
	return h
}

// owner is the uid that owns the sandbox's directory (0 with none).
func (h *heldSandbox) owner(t *testing.T) uint32 {
	t.Helper()
	if h.dir == "" {
		return 0
	}
	fi, err := os.Stat(h.dir)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Uid
}

// check fails the test unless the sandbox, after its failed destroy, is
// kept whole: its state dir, and its directory still its identity's.
func (h *heldSandbox) check(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(h.stateDir); err != nil || h.dir != "" && h.owner(t) == 0 {
		t.Fatalf("after the failed destroy: state dir %v, the directory's owner %d; want the sandbox kept whole", err, h.owner(t))
	}
}

func (h *heldSandbox) release(t *testing.T) {
	t.Helper()
	if err := os.Remove(h.hold); err != nil {
		t.Fatal(err)
	}
}

// gone checks that nothing of the sandbox is left: its state dir, its
// cgroups, its identity's lease, and its directory is the server's.
func (h *heldSandbox) gone(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(h.stateDir); !os.IsNotExist(err) {
		t.Errorf("state dir after the destroy: %v", err)
	}
	for _, d := range h.cgroups {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("cgroup %s after the destroy: %v", d, err)
		}
	}
	if uid := h.owner(t); uid != 0 {
		t.Errorf("the directory is uid %d's after the destroy, want the server's", uid)
	}
	leases := filepath.Join(h.data, "run", "identities")
	ents, _ := os.ReadDir(leases)
	for _, l := range ents {
		if b, _ := os.ReadFile(filepath.Join(leases, l.Name())); strings.Contains(string(b), h.id) {
			t.Errorf("identity %s still leased to the sandbox", l.Name())
		}
	}
}
