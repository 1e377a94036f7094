//go:build integration

package e2e_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// faultScript is the command of the fault tests' tasks: it counts its
// runs, then, a moment later, writes its output and exits 3. A task that
// ran once and whose result is its own ends failed with exit code 3,
// runs.txt holding one line and out.txt "T".
const faultScript = `echo run >> output/runs.txt; sleep 1; echo T > output/out.txt; exit 3`

// faultConfig writes the fault tests' configuration: warm pools of warm
// sandboxes of each shape, six tasks at a time, and no API rate limit (the
// checks read each task's result and events).
func faultConfig(t *testing.T, warm int) string {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "corral.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "local:\n  warm_pool: %d\nai_worker_config:\n  max_concurrent_workers: 6\nlimits:\n  api_rate: 0\n", warm), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// crashing is a corral server that kills itself at a crash point.
type crashing struct {
	*proc
	exited chan struct{} // closed once the process has ended
	err    error         // how it ended, once exited is closed
}

// startCrashing runs `corral serve` on data as startProcess does, with
// CORRAL_TEST_CRASH_AT=point: it kills itself with SIGKILL the first time
// a task reaches point ("": never). It returns once the server answers,
// or has died (a restart's reconciliation can reach point).
func startCrashing(t *testing.T, data, point string, extra ...string) *crashing {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(corralBin, append([]string{"serve", "--data", data, "--listen", addr}, extra...)...)
	cmd.Dir = t.TempDir()
	cmd.Env = withoutCorralEnv()
	if point != "" {
		cmd.Env = append(cmd.Env, "CORRAL_TEST_CRASH_AT="+point)
	}
	cmd.Stdout, cmd.Stderr = testWriter{t}, testWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &crashing{proc: &proc{cmd: cmd, client: httpapi.NewClient("http://"+addr, ""), url: "http://" + addr}, exited: make(chan struct{})}
	go func() { c.err = cmd.Wait(); close(c.exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGKILL)
		<-c.exited
		killSandboxes(t, data)
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		select {
		case <-c.exited:
			return c
		default:
		}
		if resp, err := http.Get(c.url + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return c
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server at %s never became healthy", c.url)
		}
	}
}

// dead reports whether c has ended.
func (c *crashing) dead() bool {
	select {
	case <-c.exited:
		return true
	default:
		return false
	}
}

// waitKilled waits until c, which kills itself at point, has.
func (c *crashing) waitKilled(t *testing.T, point string) {
	t.Helper()
	select {
	case <-c.exited:
		var ee *exec.ExitError
		if !errors.As(c.err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("the server ended with %v, not killed at %s", c.err, point)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the server never reached %s", point)
	}
}

// TestKill9AtEachPoint: a server killed with SIGKILL at each point of a
// task's start and end (sandbox.CrashPoints: a warm sandbox claimed, the
// task's directories moved into it, the sandbox handed over, the start
// sent; a cold sandbox's launcher started, its state written; the start
// recorded or not; the sandbox exited; the end recorded), then started
// again: the task runs once and ends with its command's own result (exit
// 3, its file written), started again where its worker never had its
// start (task_start_retried) and reattached where it had, never lost,
// never ended twice; and nothing of its sandbox outlives it, or the
// server's stop.
func TestKill9AtEachPoint(t *testing.T) {
	testenv.RequireBwrap(t)
	t.Parallel()
	for _, tt := range []struct {
		point      string
		warm       bool // the task claims a warm sandbox
		startAgain bool // the restart starts it again
	}{
		{sandbox.CrashClaimed, true, true},
		{sandbox.CrashMoved, true, true},
		{sandbox.CrashHandedOver, true, true},
		{sandbox.CrashSent, true, false},
		{sandbox.CrashLaunched, false, true},
		{sandbox.CrashGated, false, true},
		{sandbox.CrashCreated, true, false},
		{sandbox.CrashStarted, true, false},
		{sandbox.CrashExited, true, false},
		{sandbox.CrashEnded, true, false},
	} {
		t.Run(tt.point, func(t *testing.T) {
			t.Parallel()
			data := testenv.TempDir(t)
			warm := 0
			if tt.warm {
				warm = 1
			}
			cfg := faultConfig(t, warm)
			srv := startCrashing(t, data, tt.point, "--config", cfg)
			if tt.warm {
				waitProcWarm(t, srv.proc, 1)
			}
			// The kill may come before the spawn's answer: the task is
			// there all the same, and is checked as one acknowledged.
			var acked []string
			if id, err := spawnFault(srv.proc); err == nil {
				acked = append(acked, id)
			}
			srv.waitKilled(t, tt.point)

			f := checkFaults(t, startProcess(t, data, "--config", cfg), data, acked)
			if f.tasks != 1 {
				t.Fatalf("%d tasks, want the one spawned", f.tasks)
			}
			for _, types := range f.events {
				if got := slices.Contains(types, task.EventStartRetried); got != tt.startAgain {
					t.Errorf("events %v: started again %v, want %v", types, got, tt.startAgain)
				}
			}
		})
	}
}

// spawnFault spawns a task running faultScript with network none (a
// warm shape's).
func spawnFault(p *proc) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tk, _, err := p.client.Spawn(ctx, service.SpawnRequest{TaskDescription: "fault", Agent: task.AgentCommand, Network: task.NetworkNone,
		Command: []string{"sh", "-c", faultScript}})
	return tk.ID, err
}

// procWarm reads corral_warm_sandboxes from p's /metrics, by shape.
func procWarm(p *proc) map[string]uint64 {
	resp, err := http.Get(p.url + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	out := map[string]uint64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), `corral_warm_sandboxes{runtime="local",shape="`)
		if !ok {
			continue
		}
		shape, val, _ := strings.Cut(line, `"} `)
		n, _ := strconv.ParseUint(val, 10, 64)
		out[shape] = n
	}
	io.Copy(io.Discard, resp.Body)
	return out
}

// waitProcWarm waits until each of p's pools holds n warm sandboxes.
func waitProcWarm(t *testing.T, p *proc, n uint64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d warm sandboxes of each shape", n), func() bool {
		w := procWarm(p)
		return len(w) == 2 && w["none"] == n && w["egress"] == n
	})
}

var (
	warmInArgs = regexp.MustCompile(`/_warm/(warm-[0-9a-z]+)/`)
	taskInArgs = regexp.MustCompile(`/tasks/([0-9A-Za-z_-]+)`)
)

// sandboxProcs lists the processes outside sandboxes that keep the
// sandboxes on data running (their launchers and bwrap, whose command
// lines bind data's directories; everything in a sandbox dies with its
// bwrap), by sandbox: a warm sandbox's id, or a cold one's task id. The
// servers' own processes are not listed.
func sandboxProcs(data string) map[string][]int {
	out := map[string][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(b), data+"/") || strings.HasPrefix(string(b), corralBin+"\x00") {
			continue
		}
		id := "?"
		if m := warmInArgs.FindStringSubmatch(string(b)); m != nil {
			id = m[1]
		} else if m := taskInArgs.FindStringSubmatch(string(b)); m != nil {
			id = m[1]
		}
		out[id] = append(out[id], pid)
	}
	return out
}

// leftover is sandboxProcs less the warm sandboxes still in a pool (their
// state directories still named as warm).
func leftover(data string) map[string][]int {
	out := sandboxProcs(data)
	for id := range out {
		if strings.HasPrefix(id, "warm-") {
			if _, err := os.Stat(filepath.Join(data, "run", "local", id)); err == nil {
				delete(out, id)
			}
		}
	}
	return out
}

// stop stops p as an operator does, with SIGTERM, and waits for it.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the server did not stop within 30s of SIGTERM")
	}
}

// faults counts what a fault test found wrong, and has the event types
// of each task.
type faults struct {
	tasks, lost, stuck, wrong, leaked int
	events                            map[string][]string
}

// checkFaults checks every task on the server p (each of acked among
// them) once they have ended, then what is left of their sandboxes, then
// that a clean stop leaves no sandbox process: faults says how many tasks
// were lost, stuck or wrong and how many sandboxes leaked. Each fault is
// logged.
func checkFaults(t *testing.T, p *proc, data string, acked []string) faults {
	t.Helper()
	ctx := context.Background()
	f := faults{events: map[string][]string{}}
	var all []task.Task
	for cursor := ""; ; {
		page, err := p.client.List(ctx, service.ListRequest{Limit: 100, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page.Tasks...)
		if cursor = page.NextCursor; cursor == "" {
			break
		}
	}
	f.tasks = len(all)
	for _, id := range acked {
		if !slices.ContainsFunc(all, func(tk task.Task) bool { return tk.ID == id }) {
			t.Errorf("acknowledged task %s is not in the list", id)
			f.lost++
		}
	}
	deadline := time.Now().Add(90 * time.Second)
	for _, tk := range all {
		res, err := p.client.Result(ctx, service.ResultRequest{TaskID: tk.ID, Wait: time.Until(deadline),
			IncludeFileContents: []string{"out.txt", "runs.txt"}})
		if err != nil {
			t.Fatal(err)
		}
		var ends int
		p.client.Events(ctx, service.EventsRequest{TaskID: tk.ID}, func(e eventstore.Event) error {
			if e.Type == task.EventCompleted {
				ends++
			}
			f.events[tk.ID] = append(f.events[tk.ID], e.Type)
			return nil
		})
		code := "none"
		if res.ExitCode != nil {
			code = strconv.Itoa(*res.ExitCode)
		}
		out, runs := res.FileContents["out.txt"].Content, res.FileContents["runs.txt"].Content
		switch {
		case !res.Status.Terminal():
			f.stuck++
			t.Errorf("task %s: still %s", tk.ID, res.Status)
		case strings.HasPrefix(res.ErrorMessage, "lost"):
			f.lost++
			t.Errorf("task %s: %s (exit code %s, runs %q): %s", tk.ID, res.Status, code, runs, res.ErrorMessage)
		case res.Status != task.Failed || code != "3" || out != "T\n" || runs != "run\n" || ends != 1:
			f.wrong++
			t.Errorf("task %s: %s, exit code %s, out.txt %q, runs.txt %q, %d ends (%s); want failed, exit code 3, T, one run, one end",
				tk.ID, res.Status, code, out, runs, ends, res.ErrorMessage)
		}
	}
	// A sandbox goes once its task has ended and its worker exited, or
	// after the exit grace (10 s) at most.
	left := leftover(data)
	for deadline := time.Now().Add(20 * time.Second); len(left) > 0 && time.Now().Before(deadline); left = leftover(data) {
		time.Sleep(100 * time.Millisecond)
	}
	for id, pids := range left {
		f.leaked++
		t.Errorf("sandbox %s still has processes %v after its task ended", id, pids)
	}
	p.stop(t)
	left = sandboxProcs(data)
	for deadline := time.Now().Add(10 * time.Second); len(left) > 0 && time.Now().Before(deadline); left = sandboxProcs(data) {
		time.Sleep(100 * time.Millisecond)
	}
	for id, pids := range left {
		f.leaked++
		t.Errorf("sandbox %s still has processes %v after the server stopped", id, pids)
	}
	return f
}

// soakRounds is how many rounds TestKill9Soak runs: CORRAL_SOAK_ROUNDS,
// else a few, as CI runs it.
func soakRounds(t *testing.T) int {
	if v := os.Getenv("CORRAL_SOAK_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("CORRAL_SOAK_ROUNDS=%q: want a number of rounds", v)
		}
		return n
	}
	return 3
}

// TestKill9Soak: the server killed with SIGKILL round after round, while
// eight tasks at a time claim warm sandboxes (four of each shape), start
// cold when the pool is short, run and report, then a clean stop: every
// task ends exactly once with what its command really did (exit 3, its
// file written, run once), none is lost or stuck, and no sandbox process
// outlives its task or, warm, the server's stop. Half the rounds kill at
// a random instant 0 to 400 ms after the spawns, from outside; the other
// half at a random one of sandbox.CrashPoints, the first time any task
// reaches it (the windows of a claim are microseconds wide, which random
// instants seldom hit), or from outside after 5 s if none does.
// CORRAL_SOAK_ROUNDS sets how many rounds (CI: 3), CORRAL_SOAK_SEED the
// seed, which the test logs with the figures.
func TestKill9Soak(t *testing.T) {
	testenv.RequireBwrap(t)
	t.Parallel()
	rounds := soakRounds(t)
	data := testenv.TempDir(t)
	cfg := faultConfig(t, 4)
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("CORRAL_SOAK_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	var (
		mu    sync.Mutex
		acked []string
	)
	kills := map[string]int{} // by crash point, "instant" for a kill from outside
	for round := range rounds {
		point := ""
		if rng.IntN(2) == 0 {
			point = sandbox.CrashPoints[rng.IntN(len(sandbox.CrashPoints))]
		}
		srv := startCrashing(t, data, point, "--config", cfg)
		if srv.dead() {
			kills[point]++ // in its reconciliation
			continue
		}
		if round == 0 || rng.IntN(2) == 0 {
			waitFor(t, "full warm pools, or the server's end", func() bool {
				w := procWarm(srv.proc)
				return srv.dead() || (w["none"] == 4 && w["egress"] == 4)
			})
		}
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				if id, err := spawnFault(srv.proc); err == nil {
					mu.Lock()
					acked = append(acked, id)
					mu.Unlock()
				}
			})
		}
		wait := 5 * time.Second
		if point == "" {
			wait = time.Duration(rng.IntN(400)) * time.Millisecond
		}
		select {
		case <-srv.exited:
			kills[point]++
		case <-time.After(wait):
			srv.cmd.Process.Signal(syscall.SIGKILL)
			<-srv.exited
			kills["instant"]++
		}
		wg.Wait()
	}
	srv := startProcess(t, data, "--config", cfg)
	f := checkFaults(t, srv, data, acked)
	again := 0
	for _, types := range f.events {
		if slices.Contains(types, task.EventStartRetried) {
			again++
		}
	}
	t.Logf("%d rounds (kills: %v): %d tasks acknowledged (%d in all, %d started again after a kill), %d lost, %d stuck, %d wrong, %d leaked",
		rounds, kills, len(acked), f.tasks, again, f.lost, f.stuck, f.wrong, f.leaked)
}
