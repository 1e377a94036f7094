//go:build integration

package e2e_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// proc is a corral server running as its own process, to be killed with
// SIGKILL.
type proc struct {
	cmd    *exec.Cmd
	client *httpapi.Client
	url    string
}

// startProcess runs `corral serve` on data and a free loopback port, with
// extra flags, and without the test's CORRAL_* and AI_WORKER_* variables.
// When the test ends the server is killed, and the sandboxes on data with
// it (killSandboxes).
func startProcess(t *testing.T, data string, extra ...string) *proc {
	t.Helper()
	return startProcessAt(t, data, freeLoopbackAddr(t), "", extra...)
}

// startKillable starts a server process with extra flags on a fresh data
// root, for a test that kills it and starts another on the same data; it
// returns the data root and the process.
func startKillable(t *testing.T, extra ...string) (string, *proc) {
	t.Helper()
	testenv.RequireBwrap(t)
	data := testenv.TempDir(t)
	return data, startProcess(t, data, extra...)
}

// startProcessAt is startProcess listening on addr, its client sending
// token.
func startProcessAt(t *testing.T, data, addr, token string, extra ...string) *proc {
	t.Helper()
	cmd := serveCommand(t, data, addr, extra...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, client: httpapi.NewClient("http://"+addr, token), url: "http://" + addr}
	t.Cleanup(func() {
		p.kill()
		killSandboxes(t, data)
	})
	waitHealthy(t, p.url)
	return p
}

// serveCommand is `corral serve` on data and addr with extra flags, not
// started: it runs in a directory of its own, without the test's CORRAL_*
// and AI_WORKER_* variables, and logs to the test's log.
func serveCommand(t *testing.T, data, addr string, extra ...string) *exec.Cmd {
	cmd := exec.Command(corralBin, append([]string{"serve", "--data", data, "--listen", addr}, extra...)...)
	cmd.Dir = t.TempDir()
	cmd.Env = withoutCorralEnv()
	cmd.Stdout, cmd.Stderr = testWriter{t}, testWriter{t}
	return cmd
}

// waitRunning waits until task id runs.
func (p *proc) waitRunning(t *testing.T, id string, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(20 * time.Millisecond) {
		got, err := p.client.Get(context.Background(), id)
		if err == nil && got.Status == task.Running {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("task never ran: %v %v", got.Status, err)
		}
	}
}

func (p *proc) kill() {
	if p.cmd.ProcessState == nil {
		p.cmd.Process.Signal(syscall.SIGKILL)
		p.cmd.Wait()
	}
}

func TestKill9WithRunningAndQueuedTasks(t *testing.T) {
	t.Parallel()
	data, srv := startKillable(t, "--max-concurrent", "2")
	ctx := context.Background()
	spawn := func(desc, script string) string {
		tk := mustSpawn(t, srv.client, service.SpawnRequest{TaskDescription: desc, Command: []string{"sh", "-c", script}})
		return tk.ID
	}
	// finisher ends while the server is down; survivor runs across the
	// restart; three more wait in the queue.
	finisher := spawn("finishes while the server is down", "sleep 1.01; echo finished > output/result.txt")
	survivor := spawn("runs across the restart", "sleep 6.01; echo survived > output/result.txt")
	var queued []string
	for i := 0; i < 3; i++ {
		queued = append(queued, spawn("queued", "echo ran > output/result.txt"))
	}
	for _, id := range []string{finisher, survivor} {
		srv.waitRunning(t, id, 20*time.Second)
	}
	for deadline := time.Now().Add(5 * time.Second); !processRunning("sleep", "6.01") && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	srv.kill()
	time.Sleep(100 * time.Millisecond)
	if !processRunning("sleep", "6.01") {
		t.Fatal("the worker died with the server")
	}
	time.Sleep(2 * time.Second) // the finisher ends while no server runs

	srv = startProcess(t, data, "--max-concurrent", "2")
	want := map[string]string{finisher: "finished\n", survivor: "survived\n"}
	for _, id := range queued {
		want[id] = "ran\n"
	}
	for id, content := range want {
		res, err := srv.client.Result(ctx, service.ResultRequest{TaskID: id, Wait: 60 * time.Second, IncludeFileContents: []string{"result.txt"}})
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != task.Success || res.FileContents["result.txt"].Content != content {
			t.Errorf("task %s: %s %q (%s), want success with %q", id, res.Status, res.FileContents["result.txt"].Content, res.ErrorMessage, content)
		}
	}
	page, err := srv.client.List(ctx, service.ListRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range page.Tasks {
		if !tk.Status.Terminal() {
			t.Errorf("task %s is still %s", tk.ID, tk.Status)
		}
	}
	var types []string
	srv.client.Events(ctx, service.EventsRequest{TaskID: survivor}, func(e eventstore.Event) error {
		types = append(types, e.Type)
		return nil
	})
	if !slices.Contains(types, task.EventReattached) {
		t.Errorf("survivor's events %v have no %s", types, task.EventReattached)
	}
	// Every task's log reads created, queued, starting, started and one
	// end, whatever the crash caught it doing.
	lifecycle := []string{task.EventCreated, task.EventQueued, task.EventStarting, task.EventStarted, task.EventCompleted}
	for id := range want {
		var got []string
		srv.client.Events(ctx, service.EventsRequest{TaskID: id}, func(e eventstore.Event) error {
			if slices.Contains(lifecycle, e.Type) {
				got = append(got, e.Type)
			}
			return nil
		})
		if !slices.Equal(got, lifecycle) {
			t.Errorf("task %s: lifecycle %v, want %v", id, got, lifecycle)
		}
	}
	// The finisher's status.json was on disk when the server came back: it
	// is recorded during reconciliation, not when its worker next retries.
	var finished, reconciled int64
	srv.client.Events(ctx, service.EventsRequest{}, func(e eventstore.Event) error {
		switch {
		case e.Type == task.EventCompleted && e.StreamID == task.StreamID(finisher):
			finished = e.Position
		case e.Type == task.EventReconciled:
			reconciled = e.Position
		}
		return nil
	})
	if finished == 0 || finished > reconciled {
		t.Errorf("the finisher ended at position %d, the restart's reconciliation at %d: want it recorded during reconciliation", finished, reconciled)
	}
	// The sandbox is destroyed once its worker exits, just after it reports.
	state := filepath.Join(data, "run", "local", survivor)
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(state); os.IsNotExist(err) {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the survivor's sandbox was not destroyed: %v", err)
		}
	}
}

// TestServeLogsRuntimesNotOffered: corral serve says at start which
// runtimes it does not offer and why (a Docker engine that is not there),
// and that a restart takes one fixed later.
func TestServeLogsRuntimesNotOffered(t *testing.T) {
	t.Parallel()
	data := testenv.TempDir(t)
	cmd := serveCommand(t, data, freeLoopbackAddr(t))
	cmd.Env = append(cmd.Env, "DOCKER_HOST=unix://"+filepath.Join(t.TempDir(), "no-engine.sock"))
	var out testenv.SyncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait(); killSandboxes(t, data) })
	waitFor(t, "the log line", func() bool {
		s := out.String()
		return strings.Contains(s, `msg="runtime not offered" runtime=docker`) && strings.Contains(s, "no-engine.sock") && strings.Contains(s, "restart the server")
	})
}
