//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// gvisorFaultConfig writes the configuration of the gVisor fault tests:
// one warm gVisor sandbox of each shape, none on the local runtime, six
// tasks at a time and no API rate limit.
func gvisorFaultConfig(t *testing.T) string {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "corral.yaml")
	y := "local:\n  warm_pool: 0\ngvisor:\n  warm_pool: 1\nai_worker_config:\n  max_concurrent_workers: 6\nlimits:\n  api_rate: 0\n"
	if err := os.WriteFile(cfg, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// runscContainers lists the containers runsc knows under data's gvisor
// state dir, running or not.
func runscContainers(t *testing.T, data string) []string {
	t.Helper()
	out, err := exec.Command("runsc", "--root="+filepath.Join(data, "run", "gvisor", "runsc"), "list", "-quiet").Output()
	if err != nil {
		t.Fatalf("runsc list: %v", err)
	}
	return strings.Fields(string(out))
}

// TestKill9AtEachPointGvisor: TestKill9AtEachPoint for a task that claims
// a warm gVisor sandbox. A server killed with SIGKILL at each step of the
// claim (the box taken from its pool, the task's directories moved into
// its slots, its state dir renamed after the task, the start written) or
// just after (Create returned: the worker acknowledges its start), then
// started again: the task runs once and ends with its command's own result
// (exit 3, its file written, its runs counted in its own directory, where
// the claim put them back or left them), started again where its worker
// never had its start and reattached where it had, never lost, never
// ended twice; no sandbox process outlives it or the server's stop, and
// runsc knows no container once the server has stopped.
func TestKill9AtEachPointGvisor(t *testing.T) {
	testenv.RequireRunsc(t)
	t.Parallel()
	for _, tt := range []struct {
		point      string
		startAgain bool // the restart starts it again
	}{
		{sandbox.CrashClaimed, true},
		{sandbox.CrashMoved, true},
		{sandbox.CrashHandedOver, true},
		{sandbox.CrashSent, false},
		{sandbox.CrashCreated, false},
	} {
		// One at a time: each server keeps two warm gVisor sandboxes.
		t.Run(tt.point, func(t *testing.T) {
			data := kill9At(t, gvisorFaultConfig(t), tt.point, "gvisor", true, tt.startAgain)
			if cs := runscContainers(t, data); len(cs) != 0 {
				t.Errorf("runsc still knows %v after the server stopped", cs)
			}
		})
	}
}

// oneTaskScript is a task's command: it reports what its sandbox's /tmp
// held before it (a sandbox that served an earlier task would hold that
// task's mark), then marks /tmp with its own id. (Not with ls: this
// gVisor fails coreutils' statx with EINVAL.)
const oneTaskScript = `for f in /tmp/* /tmp/.??*; do [ -e "$f" ] && echo "$f"; done > output/seen.txt; touch "/tmp/mark-$CORRAL_TASK_ID" && echo ok`

// startedSandbox is the sandbox a task's task_started event records:
// runsc's name of it (a claimed warm sandbox's warm id, "" for one started
// cold) and its launcher process.
type startedSandbox struct {
	Warm     string `json:"warm"`
	PID      int    `json:"pid"`
	PIDStart uint64 `json:"pid_start"`
}

// TestGvisorWarmServesOneTask: through the server, a warm gVisor sandbox
// serves exactly one task. Tasks claimed one after another, then many at
// once, each run in a sandbox of its own: the sandbox the server recorded
// for each (its runsc container, its launcher) is no other task's, one
// claimed is never in the pool again, and no task finds another's mark in
// its sandbox's /tmp.
func TestGvisorWarmServesOneTask(t *testing.T) {
	testenv.RequireRunsc(t)
	t.Parallel()
	s := MustStart(t, func(c *config.Config) { c.Local.WarmPool = 0; c.Gvisor.WarmPool = 2; c.Gvisor.WarmIdle = 0 })
	waitWarmOf(t, s, "gvisor", 2)
	spawn := func() (string, error) {
		tk, _, err := s.client.Spawn(context.Background(), service.SpawnRequest{TaskDescription: "one task", Agent: task.AgentCommand,
			Runtime: "gvisor", Network: task.NetworkNone, Command: []string{"sh", "-c", oneTaskScript}})
		return tk.ID, err
	}
	var (
		mu      sync.Mutex
		served  = map[string]string{} // runsc container of a claimed sandbox -> its task
		started = map[startedSandbox]string{}
	)
	// check checks task id's end and sandbox, and returns its warm id.
	check := func(id string) string {
		t.Helper()
		s.waitSuccess(t, id, 60*time.Second, "seen.txt")
		if b, err := os.ReadFile(filepath.Join(s.data, "tasks", id, "output", "seen.txt")); err != nil || strings.TrimSpace(string(b)) != "" {
			t.Errorf("task %s found %q in its sandbox's /tmp (%v), want nothing", id, b, err)
		}
		var ev task.Started
		if err := json.Unmarshal(s.taskEvent(t, id, task.EventStarted), &ev); err != nil {
			t.Fatal(err)
		}
		var h sandbox.Handle
		var sb startedSandbox
		if err := json.Unmarshal(ev.Handle, &h); err != nil || h.Runtime != "gvisor" {
			t.Fatalf("task %s's sandbox %s (%v): want a gvisor one", id, ev.Handle, err)
		}
		if err := json.Unmarshal(h.State, &sb); err != nil || sb.PID == 0 {
			t.Fatalf("task %s's sandbox state %s (%v)", id, h.State, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if other, ok := started[sb]; ok {
			t.Errorf("tasks %s and %s ran in the same sandbox %+v", other, id, sb)
		}
		started[sb] = id
		if sb.Warm != "" {
			if other, ok := served[sb.Warm]; ok {
				t.Errorf("warm sandbox %s served task %s and then %s", sb.Warm, other, id)
			}
			served[sb.Warm] = id
		}
		return sb.Warm
	}
	pool := func() []string {
		ents, _ := os.ReadDir(filepath.Join(s.data, "run", "gvisor"))
		var ids []string
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "warm-") {
				ids = append(ids, e.Name())
			}
		}
		return ids
	}

	// One at a time, each into a full pool: every task is a claim of one
	// of the sandboxes ready, and that sandbox is never in the pool again.
	for i := range 4 {
		waitWarmOf(t, s, "gvisor", 2)
		before := pool()
		id, err := spawn()
		if err != nil {
			t.Fatal(err)
		}
		warm := check(id)
		if !slices.Contains(before, warm) {
			t.Fatalf("task %d ran in %q, not one of the warm sandboxes ready %v", i, warm, before)
		}
		waitWarmOf(t, s, "gvisor", 2)
		for _, w := range pool() {
			if task, ok := served[w]; ok {
				t.Fatalf("warm sandbox %s, which served task %s, is in the pool again", w, task)
			}
		}
	}

	// Six at once against a pool of two: some claim, the rest start cold,
	// each alone in its sandbox.
	claims0 := warmPoolsOf(t, s, "gvisor", "corral_warm_claims_total")["none"]
	ids := make([]string, 6)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() {
			id, err := spawn()
			if err != nil {
				t.Error(err)
			}
			ids[i] = id
		})
	}
	wg.Wait()
	warmRuns := 0
	for _, id := range ids {
		if id != "" && check(id) != "" {
			warmRuns++
		}
	}
	if claims := warmPoolsOf(t, s, "gvisor", "corral_warm_claims_total")["none"] - claims0; claims < 2 || uint64(warmRuns) != claims {
		t.Errorf("6 tasks at once: %d claims, %d tasks in a warm sandbox; want the 2 ready claimed at least, each claim one task's", claims, warmRuns)
	}
}
