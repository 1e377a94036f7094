//go:build integration

package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
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
	"github.com/corral-dev/corral/internal/session"
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
// checks read each task's result and events); with docker, the docker
// runtime on the tests' engine and image too (the default runtime stays
// local).
func faultConfig(t *testing.T, warm int, docker bool) string {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "corral.yaml")
	y := fmt.Sprintf("local:\n  warm_pool: %d\nai_worker_config:\n  max_concurrent_workers: 6\n", warm)
	if docker {
		y += "  ai_coder_image: " + testenv.DockerImage + "\ndocker:\n  host: unix://" + testenv.DockerSocket + "\n"
	}
	y += "limits:\n  api_rate: 0\n"
	if err := os.WriteFile(cfg, []byte(y), 0o600); err != nil {
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
	addr := freeLoopbackAddr(t)
	cmd := serveCommand(t, data, addr, extra...)
	if point != "" {
		cmd.Env = append(cmd.Env, "CORRAL_TEST_CRASH_AT="+point)
	}
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

// killed reports whether c, which has ended, was killed with SIGKILL.
func killed(c *crashing) bool {
	var ee *exec.ExitError
	return errors.As(c.err, &ee) && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL
}

// lockHolders lists the processes that hold data's event store lock file
// open (pid: command line | /proc/pid/stat), for a server that cannot
// start.
func lockHolders(data string) []string {
	var out []string
	want := filepath.Join(data, "corral.db.lock")
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		fds, _ := os.ReadDir(filepath.Join("/proc", e.Name(), "fd"))
		for _, fd := range fds {
			if l, _ := os.Readlink(filepath.Join("/proc", e.Name(), "fd", fd.Name())); l == want {
				b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
				st, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
				out = append(out, e.Name()+": "+strings.ReplaceAll(string(b), "\x00", " ")+" | "+string(st))
			}
		}
	}
	return out
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
			warm := 0
			if tt.warm {
				warm = 1
			}
			kill9At(t, faultConfig(t, warm, false), tt.point, "local", tt.warm, tt.startAgain)
		})
	}
}

// kill9At is one case of the SIGKILL tests: a server with the
// configuration cfg, its pools of runtime waited for when warm, killed at
// point while its one task (on runtime) starts, then started again on the
// same data (returned), whose result checkFaults checks; the task was
// started again (task_start_retried) if and only if startAgain.
func kill9At(t *testing.T, cfg, point, runtime string, warm, startAgain bool) (data string) {
	t.Helper()
	data = testenv.TempDir(t)
	srv := startCrashing(t, data, point, "--config", cfg)
	if warm {
		waitProcWarmOf(t, srv.proc, runtime, 1)
	}
	// The kill may come before the spawn's answer: the task is there all
	// the same, and is checked as one acknowledged.
	var acked []string
	if id, err := spawnFault(srv.proc, runtime); err == nil {
		acked = append(acked, id)
	}
	srv.waitKilled(t, point)

	f := checkFaults(t, startProcess(t, data, "--config", cfg), data, acked)
	if f.tasks != 1 {
		t.Fatalf("%d tasks, want the one spawned", f.tasks)
	}
	for _, types := range f.events {
		if got := slices.Contains(types, task.EventStartRetried); got != startAgain {
			t.Errorf("events %v: started again %v, want %v", types, got, startAgain)
		}
	}
	return data
}

// spawnFault spawns a task running faultScript with network none (a
// warm shape's) on runtime ("": the default, local).
func spawnFault(p *proc, runtime string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tk, _, err := p.client.Spawn(ctx, service.SpawnRequest{TaskDescription: "fault", Agent: task.AgentCommand, Network: task.NetworkNone,
		Runtime: runtime, Command: []string{"sh", "-c", faultScript}})
	return tk.ID, err
}

// procWarm reads the local runtime's corral_warm_sandboxes from p's
// /metrics, by shape.
func procWarm(p *proc) map[string]uint64 { return procWarmOf(p, "local") }

// procWarmOf is procWarm for runtime's pools.
func procWarmOf(p *proc, runtime string) map[string]uint64 {
	resp, err := http.Get(p.url + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	out := map[string]uint64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), `corral_warm_sandboxes{runtime="`+runtime+`",shape="`)
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

// waitProcWarm waits until each of p's local pools holds n warm
// sandboxes.
func waitProcWarm(t *testing.T, p *proc, n uint64) {
	t.Helper()
	waitProcWarmOf(t, p, "local", n)
}

// waitProcWarmOf is waitProcWarm for runtime's pools.
func waitProcWarmOf(t *testing.T, p *proc, runtime string, n uint64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d warm %s sandboxes of each shape", n, runtime), func() bool {
		w := procWarmOf(p, runtime)
		return len(w) == 2 && w["none"] == n && w["egress"] == n
	})
}

var (
	// A local warm sandbox's bwrap binds its slots, _warm/<id>/<n>; a
	// gVisor one's launcher and runsc processes name its state dir,
	// run/gvisor/<id>/, which they keep naming once it is claimed.
	warmInArgs    = regexp.MustCompile(`/(?:_warm|run/gvisor)/(warm-[0-9a-z-]+)/`)
	sessionInArgs = regexp.MustCompile(`/(sess-[0-9a-z]+)`)
	taskInArgs    = regexp.MustCompile(`/tasks/([0-9A-Za-z_-]+)`)
)

// sandboxProcs lists the processes outside sandboxes that keep the
// sandboxes on data running (their launchers and bwrap, whose command
// lines bind data's directories; everything in a sandbox dies with its
// bwrap; on gVisor, the launchers, runsc, its sentry and gofer), by sandbox: a warm sandbox's id, a session's id, or a cold
// one's task id. The servers' own processes are not listed.
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
		} else if m := sessionInArgs.FindStringSubmatch(string(b)); m != nil {
			id = m[1]
		} else if m := taskInArgs.FindStringSubmatch(string(b)); m != nil {
			id = m[1]
		}
		out[id] = append(out[id], pid)
	}
	return out
}

// leftover is sandboxProcs less the warm sandboxes still in a pool (their
// state directories still named as warm), of either host runtime.
func leftover(data string) map[string][]int {
	out := sandboxProcs(data)
	for id := range out {
		if !strings.HasPrefix(id, "warm-") {
			continue
		}
		for _, rt := range []string{"local", "gvisor"} {
			if _, err := os.Stat(filepath.Join(data, "run", rt, id)); err == nil {
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
	tasks, docker, lost, stuck, wrong, leaked int
	events                                    map[string][]string
}

// checkFaults checks every task on the server p (each of acked among
// them) once they have ended, then what is left of their sandboxes (the
// local ones' processes, the docker ones' containers), then that a clean
// stop leaves no sandbox process or container: faults says how many tasks
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
	onDocker := map[string]bool{}
	for _, tk := range all {
		if tk.Runtime == "docker" {
			onDocker[tk.ID] = true
		}
	}
	f.docker = len(onDocker)
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
		var (
			ends int
			by   []string // each event's type and actor, for a fault's message
		)
		p.client.Events(ctx, service.EventsRequest{TaskID: tk.ID}, func(e eventstore.Event) error {
			if e.Type == task.EventCompleted {
				ends++
			}
			f.events[tk.ID] = append(f.events[tk.ID], e.Type)
			by = append(by, e.Type+" by "+e.Actor)
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
			t.Errorf("task %s (%s): still %s", tk.ID, tk.Runtime, res.Status)
		case strings.HasPrefix(res.ErrorMessage, "lost"):
			f.lost++
			t.Errorf("task %s (%s): %s (exit code %s, runs %q): %s", tk.ID, tk.Runtime, res.Status, code, runs, res.ErrorMessage)
		case res.Status != task.Failed || code != "3" || out != "T\n" || runs != "run\n" || ends != 1:
			f.wrong++
			t.Errorf("task %s (%s): %s, exit code %s, out.txt %q, runs.txt %q, %d ends (%s; events %v); want failed, exit code 3, T, one run, one end",
				tk.ID, tk.Runtime, res.Status, code, out, runs, ends, res.ErrorMessage, by)
		}
	}
	// leaks counts what is left within d: sandbox processes (procs) and
	// docker tasks' containers.
	leaks := func(procs func(string) map[string][]int, d time.Duration, when string) {
		left, containers := procs(data), taskContainers(t, onDocker)
		for deadline := time.Now().Add(d); len(left)+len(containers) > 0 && time.Now().Before(deadline); left, containers = procs(data), taskContainers(t, onDocker) {
			time.Sleep(100 * time.Millisecond)
		}
		for id, pids := range left {
			f.leaked++
			t.Errorf("sandbox %s still has processes %v %s", id, pids, when)
		}
		for id, cs := range containers {
			f.leaked++
			t.Errorf("docker task %s still has containers %v %s", id, cs, when)
		}
	}
	// A sandbox goes once its task has ended and its worker exited, or
	// after the exit grace (10 s) at most; a docker task's container
	// with it.
	leaks(leftover, 20*time.Second, "after its task ended")
	p.stop(t)
	leaks(sandboxProcs, 10*time.Second, "after the server stopped")
	return f
}

// taskContainers lists the Docker engine's containers, running or not,
// of the tasks in ids (by the label sandbox.LabelTaskID, which the docker
// runtime puts on each task's container), by task id. Nil without docker
// tasks: the engine is not asked.
func taskContainers(t *testing.T, ids map[string]bool) map[string][]string {
	t.Helper()
	if len(ids) == 0 {
		return nil
	}
	out, err := exec.Command("docker", "-H", "unix://"+testenv.DockerSocket, "ps", "-a", "--filter", "label="+sandbox.LabelTaskID,
		"--format", `{{.ID}} {{.Label "`+sandbox.LabelTaskID+`"}}`).Output()
	if err != nil {
		t.Fatalf("docker ps: %v", err)
	}
	found := map[string][]string{}
	for line := range strings.Lines(string(out)) {
		c, id, _ := strings.Cut(strings.TrimSpace(line), " ")
		if ids[id] {
			found[id] = append(found[id], c)
		}
	}
	return found
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

// The soak's session commands: each prints a line at once (its stream's
// first chunk, which acknowledges its start to the client), a moment
// later appends its tag to execs.txt in the session's directory and exits
// 4. One that ran once and ended with its own result is completed with
// exit code 4 and its tag is in the file once. probeCommand waits for a
// session's exec agent to be back after a restart.
const (
	execScript   = "echo started; sleep %s; echo %s >> execs.txt; exit 4"
	probeCommand = "true"
)

// execTag finds an exec's tag in its command as exec_started records it.
var execTag = regexp.MustCompile(`echo (soak-r[0-9]+-[0-9]+) >> execs\.txt`)

// soakExec is a command the soak ran in a session, and what its client
// was told.
type soakExec struct {
	session, tag, sleep string
	acked               bool             // its stream started: the start was acknowledged
	end                 *session.ExecEnd // the end it was answered, if it was
}

// run runs e's command in its session on p, until its end or the
// server's.
func (e *soakExec) run(p *proc) {
	// Past the server's kill the client reads on from its offset for a
	// while (at the dead server's address, where the next one is not):
	// the round does not wait for that.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	end, err := p.client.ExecSession(ctx, e.session, httpapi.ExecBody{Command: shell(fmt.Sprintf(execScript, e.sleep, e.tag))},
		func(httpapi.ExecChunk) error { e.acked = true; return nil })
	if err == nil {
		e.acked, e.end = true, &end
	}
}

// probeAgents runs probeCommand in each session on p at once, so that
// their exec agents have dialled p in (after a restart an exec waits up
// to 30 s for its agent); it gives up at p's end.
func probeAgents(p *proc, sessions []string) {
	var wg sync.WaitGroup
	for _, id := range sessions {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			p.client.ExecSession(ctx, id, httpapi.ExecBody{Command: shell(probeCommand)}, func(httpapi.ExecChunk) error { return nil })
		})
	}
	wg.Wait()
}

// execFaults counts the soak's session commands (probes aside) and what
// the checks found wrong.
type execFaults struct {
	acked, recorded, probes, completed, lost int // lost: ended as lost, the server killed while it ran
	missing, stuck, wrong, leaked            int
}

// checkExecs checks, on the server p after the last restart, every exec
// recorded in sessions (those the soak ran, each of tried among them, and
// the probes): each has exactly one end, which is either "lost" (its
// command may or may not have left its line, never twice) or its
// command's own (exit 4 and its tag once in execs.txt; a probe's exit
// 0); each acknowledged one is recorded, one answered with an end was
// answered the recorded one, and no command left its line without a
// record. Then the sessions, which outlive the kills, are still running;
// they are deleted, and none may keep a sandbox process.
func checkExecs(t *testing.T, p *proc, data string, sessions []string, tried []*soakExec) execFaults {
	t.Helper()
	ctx := context.Background()
	var f execFaults
	type record struct {
		session, tag, command string
		ends                  []session.ExecEnd
	}
	streams := map[string]string{} // stream -> session
	for _, id := range sessions {
		streams[session.StreamID(id)] = id
	}
	// The commands the last kill cut run on in their sandboxes: their
	// agents dial the new server in and hand them over, each ended then
	// with its own result, or lost once the agent's wait is up. Read the
	// log until none is open.
	var records map[string]*record // by exec id
	for deadline := time.Now().Add(45 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		records = map[string]*record{}
		f = execFaults{}
		readRecords := func() {
			for after := ""; ; {
				n := 0
				err := p.client.Events(ctx, service.EventsRequest{After: after}, func(e eventstore.Event) error {
					n++
					after = e.ID
					id, ok := streams[e.StreamID]
					if !ok {
						return nil
					}
					var d struct {
						session.ExecEnd
						Command string `json:"command"`
					}
					if err := json.Unmarshal(e.Data, &d); err != nil {
						return nil
					}
					switch e.Type {
					case session.EventExecStart:
						r := &record{session: id, command: d.Command}
						if m := execTag.FindStringSubmatch(d.Command); m != nil {
							r.tag = m[1]
						}
						if records[d.ExecID] != nil {
							f.wrong++
							t.Errorf("exec %s started twice", d.ExecID)
						}
						records[d.ExecID] = r
					case session.EventExecEnd:
						if r := records[d.ExecID]; r != nil {
							r.ends = append(r.ends, d.ExecEnd)
						} else {
							f.wrong++
							t.Errorf("session %s: exec %s ended (%+v) without having started", id, d.ExecID, d.ExecEnd)
						}
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					return
				}
			}
		}
		readRecords()
		open := 0
		for _, r := range records {
			if len(r.ends) == 0 {
				open++
			}
		}
		if open == 0 || time.Now().After(deadline) {
			break
		}
	}
	lines := map[string]int{} // tag -> lines in its session's execs.txt
	for _, id := range sessions {
		b, err := os.ReadFile(filepath.Join(data, "sessions", id, "execs.txt"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		for l := range strings.Lines(string(b)) {
			lines[strings.TrimSuffix(l, "\n")]++
		}
	}
	byTag := map[string][]string{} // tag -> exec ids
	for ex, r := range records {
		probe := r.tag == "" && r.command == "/bin/sh -c "+probeCommand
		switch {
		case probe:
			f.probes++
		case r.tag == "":
			f.wrong++
			t.Errorf("exec %s: a command the soak never ran: %q", ex, r.command)
			continue
		default:
			f.recorded++
			byTag[r.tag] = append(byTag[r.tag], ex)
		}
		if len(r.ends) == 0 {
			f.stuck++
			t.Errorf("exec %s (%s) of session %s: started, never ended", ex, r.tag, r.session)
			continue
		}
		end := r.ends[0]
		switch {
		case len(r.ends) > 1:
			f.wrong++
			t.Errorf("exec %s (%s): %d ends %+v, want one", ex, r.tag, len(r.ends), r.ends)
		case end.Reason == "lost" && lines[r.tag] <= 1:
			if !probe {
				f.lost++
			}
		case end.Reason == "" && end.Error == "" && probe && end.ExitCode == 0:
		case end.Reason == "" && end.Error == "" && !probe && end.ExitCode == 4 && lines[r.tag] == 1:
			f.completed++
		default:
			f.wrong++
			t.Errorf("exec %s (%s): ended %+v, its line %d times in execs.txt; want lost, or exit code 4 (a probe's 0) and its line once",
				ex, r.tag, end, lines[r.tag])
		}
	}
	ran := map[string]bool{}
	for _, e := range tried {
		ran[e.tag] = true
		if e.acked {
			f.acked++
		}
		ids := byTag[e.tag]
		switch {
		case len(ids) > 1:
			f.wrong++
			t.Errorf("exec %s: recorded %d times (%v), want once", e.tag, len(ids), ids)
		case len(ids) == 0 && e.acked:
			f.missing++
			t.Errorf("exec %s: acknowledged (its output streamed), never recorded", e.tag)
		case len(ids) == 0 && lines[e.tag] > 0:
			f.wrong++
			t.Errorf("exec %s: never recorded, yet its command ran (its line %d times)", e.tag, lines[e.tag])
		}
		if e.end == nil {
			continue
		}
		r := records[e.end.ExecID]
		if e.end.ExitCode != 4 || e.end.Reason != "" || e.end.Error != "" || r == nil || r.tag != e.tag || len(r.ends) == 0 || r.ends[0] != *e.end {
			f.wrong++
			t.Errorf("exec %s: answered %+v, recorded %+v; want exit code 4, as recorded", e.tag, *e.end, r)
		}
	}
	for tag, n := range lines {
		if !ran[tag] {
			f.wrong++
			t.Errorf("execs.txt holds %d lines %q of no exec the soak ran", n, tag)
		}
	}
	for _, id := range sessions {
		s, err := p.client.GetSession(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if s.Status != session.StatusRunning {
			t.Errorf("session %s: %s (%s %s), want still running after the kills", id, s.Status, s.EndReason, s.EndError)
		}
		if _, err := p.client.DeleteSession(ctx, id); err != nil {
			t.Errorf("delete session %s: %v", id, err)
		}
	}
	left := sandboxProcs(data)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); left = sandboxProcs(data) {
		if !slices.ContainsFunc(sessions, func(id string) bool { return left[id] != nil }) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, id := range sessions {
		if pids := left[id]; pids != nil {
			f.leaked++
			t.Errorf("session %s still has processes %v after its deletion", id, pids)
		}
	}
	return f
}

// TestKill9Soak: the server killed with SIGKILL round after round, while
// eight tasks at a time claim warm sandboxes (four of each shape), start
// cold when the pool is short, run and report, two tasks run on docker
// (where an engine is; outside CI the soak runs without them), and three
// commands run in two sessions made before the rounds; then a clean stop.
// Every task ends exactly once with what its command really did (exit 3,
// its file written, run once), none is lost or stuck, and no sandbox
// process outlives its task or, warm, the server's stop, nor a docker
// task's container its task. Every session command whose start was
// acknowledged (its output began to stream) is recorded, and every
// recorded one ends exactly once: with its command's own end (exit 4, its
// line appended once to a file of its session) or as lost (the kill cut
// it; the restart records that), never stuck, never twice, never a
// "completed" its command did not do; none ran unrecorded, and the
// sessions themselves survive every kill and leave nothing once deleted.
// Each round waits for the sessions' exec agents to dial the new server
// in (but one in four, where the commands wait for them), then starts
// everything at once. Half the rounds kill at a random instant 0 to 400
// ms after the spawns, from outside; the other half at a random one of
// sandbox.CrashPoints, the first time any task reaches it (the windows of
// a claim are microseconds wide, which random instants seldom hit), or
// from outside after 5 s if none does; a server that ends otherwise than
// killed (at its start, the data root's lock still held) is a fault too.
// CORRAL_SOAK_ROUNDS sets how many rounds (CI: 3), CORRAL_SOAK_SEED the
// seed, which the test logs with the figures: tasks acknowledged (docker
// among them), lost, stuck, wrong and leaked; session commands
// acknowledged, recorded, completed, lost by a kill, acknowledged but
// missing, stuck and wrong.
func TestKill9Soak(t *testing.T) {
	testenv.RequireBwrap(t)
	t.Parallel()
	dockerTasks := 0
	t.Run("docker", func(t *testing.T) {
		testenv.RequireDocker(t) // skipped outside CI without an engine; fails in CI
		dockerTasks = 2
	})
	rounds := soakRounds(t)
	data := testenv.TempDir(t)
	cfg := faultConfig(t, 4, dockerTasks > 0)
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("CORRAL_SOAK_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	var (
		mu     sync.Mutex
		acked  []string
		docker = map[string]bool{}
		tried  []*soakExec
	)
	t.Cleanup(func() {
		// Containers a failing run left: their tasks' servers are gone.
		mu.Lock()
		defer mu.Unlock()
		for id, cs := range taskContainers(t, docker) {
			exec.Command("docker", append([]string{"-H", "unix://" + testenv.DockerSocket, "rm", "-f"}, cs...)...).Run()
			t.Logf("removed the containers of docker task %s", id)
		}
	})
	// The sessions, on a server that does not crash (a session's sandbox
	// passes the crash points of a cold start): they outlive its clean
	// stop and every kill.
	setup := startProcess(t, data, "--config", cfg)
	var sessions []string
	for range 2 {
		created, err := setup.client.CreateSession(context.Background(), session.CreateRequest{})
		if err != nil {
			t.Fatal(err)
		}
		sessions = append(sessions, created.SessionID)
	}
	setup.stop(t)
	kills := map[string]int{} // by crash point, "instant" for a kill from outside
	for round := range rounds {
		point := ""
		if rng.IntN(2) == 0 {
			point = sandbox.CrashPoints[rng.IntN(len(sandbox.CrashPoints))]
		}
		srv := startCrashing(t, data, point, "--config", cfg)
		if srv.dead() {
			if !killed(srv) {
				// Not a kill: it could not start (the data root's lock
				// still held by what outlived the server before it).
				kills["start failed"]++
				t.Errorf("round %d: the server ended at its start with %v, not killed at %q; the event store's lock is held by %q",
					round, srv.err, point, lockHolders(data))
				continue
			}
			kills[point]++ // in its reconciliation
			continue
		}
		if round == 0 || rng.IntN(2) == 0 {
			waitFor(t, "full warm pools, or the server's end", func() bool {
				w := procWarm(srv.proc)
				return srv.dead() || (w["none"] == 4 && w["egress"] == 4)
			})
		}
		if rng.IntN(4) != 0 {
			probeAgents(srv.proc, sessions)
		}
		var execs []*soakExec
		for i := range 3 {
			ms := 100 + rng.IntN(400)
			execs = append(execs, &soakExec{session: sessions[i%len(sessions)], tag: fmt.Sprintf("soak-r%d-%d", round, i),
				sleep: fmt.Sprintf("%d.%03d", ms/1000, ms%1000)})
		}
		tried = append(tried, execs...)
		var wg sync.WaitGroup
		for i := range 8 + dockerTasks {
			runtime := ""
			if i >= 8 {
				runtime = "docker"
			}
			wg.Go(func() {
				if id, err := spawnFault(srv.proc, runtime); err == nil {
					mu.Lock()
					acked = append(acked, id)
					if runtime == "docker" {
						docker[id] = true
					}
					mu.Unlock()
				}
			})
		}
		for _, e := range execs {
			wg.Go(func() { e.run(srv.proc) })
		}
		wait := 5 * time.Second
		if point == "" {
			wait = time.Duration(rng.IntN(400)) * time.Millisecond
		}
		select {
		case <-srv.exited:
			if !killed(srv) {
				kills["ended on its own"]++
				t.Errorf("round %d: the server ended with %v, not killed at %q", round, srv.err, point)
				break
			}
			kills[point]++
		case <-time.After(wait):
			srv.cmd.Process.Signal(syscall.SIGKILL)
			<-srv.exited
			kills["instant"]++
		}
		wg.Wait()
	}
	srv := startProcess(t, data, "--config", cfg)
	x := checkExecs(t, srv, data, sessions, tried)
	f := checkFaults(t, srv, data, acked)
	again := 0
	for _, types := range f.events {
		if slices.Contains(types, task.EventStartRetried) {
			again++
		}
	}
	t.Logf("%d rounds (kills: %v): tasks: %d acknowledged, %d of them on docker (%d in all, %d on docker; %d started again after a kill), %d lost, %d stuck, %d wrong, %d leaked; "+
		"session execs: %d acknowledged of %d run (%d recorded, %d agent probes besides), %d completed, %d lost by a kill, %d acknowledged but missing, %d stuck, %d wrong, %d sessions leaked",
		rounds, kills, len(acked), len(docker), f.tasks, f.docker, again, f.lost, f.stuck, f.wrong, f.leaked,
		x.acked, len(tried), x.recorded, x.probes, x.completed, x.lost, x.missing, x.stuck, x.wrong, x.leaked)
}
