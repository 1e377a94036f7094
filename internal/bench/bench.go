// Package bench is corral bench: a throwaway server on the local runtime
// and trivial tasks over HTTP, measured beside the same work done by a bare
// bubblewrap (and runsc) in the same run, so that the ratios hold on a
// noisy machine. docs/benchmarks.md has the figures and how to reproduce
// them.
package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/internal/app"
	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/rtkind"
	"github.com/corral-dev/corral/internal/sandbox/gvisor"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// Options configure Run. Zero fields take the documented defaults.
type Options struct {
	// N is how many runs each phase measures, per kind; default 200.
	N int
	// Concurrency is the number of clients in the concurrent phase and the
	// server's max_concurrent_workers; default 16.
	Concurrency int
	// Warmup is how many runs of each kind precede the measured ones and
	// are not counted; default 5.
	Warmup int
	// Data is the server's data root; "" makes a temporary one that is
	// removed afterwards.
	Data string
	// Binary is the corral executable, with corral-worker beside it, that
	// sandboxes run (app.Options.Binary); default this process's executable.
	Binary string
	// Bwrap is the bubblewrap binary for the bare runs; default "bwrap".
	Bwrap string
	// TaskTimeout bounds one task or bare run, end to end; default 60 s.
	TaskTimeout time.Duration
	// Gvisor adds, to each sequential round, a task under the gvisor
	// runtime and a bare `runsc run` of /bin/echo hi. It needs runsc.
	Gvisor bool
	// Runsc is the runsc binary for the bare runs; default "runsc".
	Runsc string
	// DockerImage adds, to each sequential round, code_execute of echo hi
	// on the local runtime and on the docker runtime in this image, the
	// task echo hi on the docker runtime in this image (cold and, with a
	// pool, warm), and a bare `docker run --rm` of the same image and
	// command. It needs a Docker engine with the image, and the docker
	// CLI.
	DockerImage string
	// DockerHost is the engine's address; default
	// unix:///var/run/docker.sock.
	DockerHost string
	// Warm is how many sandboxes of each shape the server keeps warm
	// (local.warm_pool); default config.AutoWarmPool, -1 for none. With
	// a pool each sequential round also runs the task into a full pool,
	// and the concurrent phase runs as many tasks with the pool.
	Warm int
	// CPUProfile, if set, gets a CPU profile (runtime/pprof) of this
	// process, the server and the bench's clients, over the concurrent
	// phase's cold tasks: where the server's share of a task goes.
	CPUProfile io.Writer
}

func (o *Options) setDefaults() {
	if o.N <= 0 {
		o.N = 200
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 16
	}
	if o.Warmup < 0 {
		o.Warmup = 0
	} else if o.Warmup == 0 {
		o.Warmup = 5
	}
	if o.Bwrap == "" {
		o.Bwrap = "bwrap"
	}
	if o.TaskTimeout <= 0 {
		o.TaskTimeout = 60 * time.Second
	}
	if o.Runsc == "" {
		o.Runsc = "runsc"
	}
	if o.Warm == 0 {
		o.Warm = config.AutoWarmPool
	} else if o.Warm < 0 {
		o.Warm = 0
	}
}

// Result is what Run measured. Durations are in milliseconds.
type Result struct {
	Host        Host `json:"host"`
	N           int  `json:"n"`
	Concurrency int  `json:"concurrency"`
	Warmup      int  `json:"warmup"`
	// Sequential runs one task end to end (POST to result) and one bare
	// bwrap, alternately, n times.
	Sequential Sequential `json:"sequential"`
	// Exec is code_execute against bare sandboxes (Options.DockerImage).
	Exec *Exec `json:"exec,omitempty"`
	// Concurrent runs n tasks, then n bare bwraps, from Concurrency clients.
	Concurrent Concurrent `json:"concurrent"`
	// SequentialCommits and ConcurrentCommits are the server's event log
	// commits over each phase, warm-up runs included.
	SequentialCommits Commits `json:"sequential_commits"`
	ConcurrentCommits Commits `json:"concurrent_commits"`
}

// Commits are the event log's commits over a phase (the server's
// corral_event_commit_seconds): how many, the events each held and the
// time each took (a transaction and an fsync), on average. A task waits
// for several one after another.
type Commits struct {
	Commits         uint64  `json:"commits"`
	EventsPerCommit float64 `json:"events_per_commit"`
	MeanMS          float64 `json:"mean_ms"`
}

// commitCount is the server's commit counters at one time.
type commitCount struct {
	commits, events uint64
	seconds         float64
}

// commitsBetween are the commits from before to after.
func commitsBetween(before, after commitCount) Commits {
	c := Commits{Commits: after.commits - before.commits}
	if c.Commits > 0 {
		c.EventsPerCommit = float64(after.events-before.events) / float64(c.Commits)
		c.MeanMS = (after.seconds - before.seconds) * 1000 / float64(c.Commits)
	}
	return c
}

// Host describes the machine the figures come from.
type Host struct {
	CPUs    int    `json:"cpus"`
	Kernel  string `json:"kernel"`
	Bwrap   string `json:"bwrap"`
	LoadAvg string `json:"loadavg"` // /proc/loadavg at the start: other load skews figures
}

// Tasks are one runtime's sequential task latencies, each ratio over the
// median of the bare sandbox measured in the same rounds.
type Tasks struct {
	// Task is the cold path: a task that no warm sandbox fits (its memory
	// limit 1 MiB under the default), in a sandbox started for it.
	Task Latency `json:"task"`
	// Ratio is the task's median over the bare sandbox's median.
	Ratio float64 `json:"ratio"`
	// Phases splits the task's latency by the server's event times.
	Phases TaskPhases `json:"phases"`
	// Warm is the same task with the default resources, which claims a
	// warm sandbox from a full pool (Options.Warm only), its ratio to
	// the bare sandbox's median and its phases.
	Warm       *Latency    `json:"warm,omitempty"`
	WarmRatio  float64     `json:"warm_ratio,omitempty"`
	WarmPhases *TaskPhases `json:"warm_phases,omitempty"`
}

// Sequential is the sequential phase's latencies: the local runtime's
// tasks beside bare bwrap.
type Sequential struct {
	Tasks
	Bwrap Latency `json:"bwrap"`
	// Gvisor is the same task under the gvisor runtime and a bare runsc
	// run, measured in the same rounds (Options.Gvisor only).
	Gvisor *Gvisor `json:"gvisor,omitempty"`
	// Docker is the same task under the docker runtime beside the bare
	// docker run of Exec, measured in the same rounds
	// (Options.DockerImage only).
	Docker *Docker `json:"docker,omitempty"`
}

// Docker is the docker runtime's sequential task latencies, beside bare
// docker run (Exec.DockerRun).
type Docker struct {
	Tasks
}

// Exec is code_execute's sequential latencies (Options.DockerImage only):
// a call of echo hi on each runtime, POST /api/exec to its answer, beside
// the bare sandbox of the same command.
type Exec struct {
	Local     Latency `json:"local"`
	Docker    Latency `json:"docker"`
	DockerRun Latency `json:"docker_run"` // bare docker run --rm IMAGE echo hi
	// LocalRatio is the local call's median over bare bwrap's median (the
	// bwrap of the same rounds), DockerRatio the docker call's over bare
	// docker run's.
	LocalRatio  float64 `json:"local_ratio"`
	DockerRatio float64 `json:"docker_ratio"`
}

// Gvisor is the gvisor runtime's sequential task latencies beside bare
// runsc run.
type Gvisor struct {
	Tasks
	Runsc Latency `json:"runsc"`
}

// TaskPhases are the medians of the parts of one task's latency, cut at
// the times the server stamped on its events (an event's time is taken
// when its batch begins, so each commit's fsync counts in the phase after
// it): the request until task_created; until task_starting (the scheduler
// noticing the queued task); until task_started (the task directory, the
// sandbox spec, the sandbox's create); until the terminal event (the worker
// starts in the sandbox, runs the agent, reports by webhook); and until
// the client has the result.
type TaskPhases struct {
	Submit  float64 `json:"submit_ms"`
	Queue   float64 `json:"queue_ms"`
	Sandbox float64 `json:"sandbox_ms"`
	Run     float64 `json:"run_ms"`
	Deliver float64 `json:"deliver_ms"`
	// Commits is the median count of the event log's commits from the
	// spawn's request until the client has the result: one task at a
	// time, every commit in that span is one the task's path made, and
	// the acknowledgement and the end are two it must wait for.
	Commits float64 `json:"commits"`
}

// Latency summarises measured durations.
type Latency struct {
	Count  int     `json:"count"`
	Median float64 `json:"median_ms"`
	P90    float64 `json:"p90_ms"`
	Min    float64 `json:"min_ms"`
	Max    float64 `json:"max_ms"`
}

// Throughput is what a concurrent phase completed in how long, and the
// host's CPU time per run: every CPU's busy time (/proc/stat) from the
// phase's start until its sandboxes are gone, so the kernel's deferred
// work counts (namespaces torn down in workqueues and RCU callbacks:
// processes' own times, getrusage, showed 37 % of a bare bwrap's cost
// here), and so does any other load on the host. On C cores runs per
// second is at most C * 1000 / CPU ms per run.
type Throughput struct {
	Completed int     `json:"completed"`
	Wall      float64 `json:"wall_ms"`
	PerSecond float64 `json:"per_second"`
	CPU       float64 `json:"cpu_ms_per_run"`
}

// Concurrent is the concurrent phase's throughputs.
type Concurrent struct {
	// Task are cold tasks, Warm tasks of the warm pools' shape (each
	// claims a warm sandbox if one is ready; the pool refills meanwhile).
	Task  Throughput  `json:"task"`
	Warm  *Throughput `json:"warm,omitempty"`
	Bwrap Throughput  `json:"bwrap"`
	// Ratio is bare bwrap's runs per second over the tasks per second.
	Ratio float64 `json:"ratio"`
}

// Run measures what Corral adds to a bare bubblewrap sandbox: it starts a
// server in this process on 127.0.0.1:0 and runs the command task
// ["echo","hi"] over its HTTP API beside `bwrap ... /bin/echo hi`, first
// one at a time, interleaved, then from opts.Concurrency clients at once.
// Every run must succeed (status success and summary "hi"; echo printing
// "hi"), or Run returns an error. It needs root and bubblewrap, and
// returns errdefs.ErrFailedPrecondition without them. Server logs go to log.
func Run(ctx context.Context, opts Options, log *slog.Logger) (*Result, error) {
	opts.setDefaults()
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("bench needs root (sandboxes use cgroups, as corral serve does): %w", errdefs.ErrFailedPrecondition)
	}
	bwrap, err := exec.LookPath(opts.Bwrap)
	if err != nil {
		return nil, fmt.Errorf("bench needs bubblewrap (install: apt-get install -y bubblewrap): %w", errdefs.ErrFailedPrecondition)
	}
	res := &Result{N: opts.N, Concurrency: opts.Concurrency, Warmup: opts.Warmup, Host: benchHost(bwrap)}

	data := opts.Data
	if data == "" {
		if data, err = os.MkdirTemp("", "corral-bench-"); err != nil {
			return nil, fmt.Errorf("create bench data root: %w", err)
		}
		defer os.RemoveAll(data)
	}
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.Data = data
	cfg.Local.Bwrap = bwrap
	cfg.AIWorker.MaxConcurrentWorkers = opts.Concurrency
	cfg.AIWorker.MaxQueuedTasks = max(cfg.AIWorker.MaxQueuedTasks, 2*opts.Concurrency)
	cfg.Agents.Default = task.AgentCommand
	cfg.Local.WarmPool, cfg.Local.WarmIdle = opts.Warm, 0
	var runsc string // with Gvisor: the server's runsc and the bare runs'
	if opts.Gvisor {
		if runsc, err = exec.LookPath(opts.Runsc); err != nil {
			return nil, fmt.Errorf("bench with gvisor needs runsc (install: apt-get install -y runsc): %w", errdefs.ErrFailedPrecondition)
		}
		cfg.Gvisor.Runsc = runsc
		if opts.Warm > 0 {
			// One of each shape is what the sequential rounds claim: each
			// round waits for the pool to be full again.
			cfg.Gvisor.WarmPool, cfg.Gvisor.WarmIdle = 1, 0
		}
	}
	// The bench's clients make hundreds of requests a second through one
	// caller: what it measures is the tasks, not limits.api_rate.
	cfg.Limits.APIRate = 0
	if opts.DockerImage != "" {
		// The exec rows measure code_execute, off unless turned on.
		cfg.Execution.Enabled = true
		cfg.Execution.DefaultImage = opts.DockerImage
		cfg.AIWorker.AICoderImage = opts.DockerImage
		if opts.Warm > 0 {
			cfg.Docker.WarmPool, cfg.Docker.WarmIdle = 1, 0
		}
		if opts.DockerHost != "" {
			cfg.Docker.Host = opts.DockerHost
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("bench configuration: %w", err)
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	a, err := app.New(sctx, cfg, log, app.Options{Binary: opts.Binary})
	if err != nil {
		return nil, fmt.Errorf("start bench server: %w", err)
	}
	defer a.Close()
	served := make(chan error, 1)
	go func() { served <- a.Run(sctx) }()
	defer func() {
		stop()
		<-served
		// A throwaway server: nothing of its sandboxes may outlive it, even
		// when the bench stopped half-way.
		if err := a.DestroySandboxes(context.WithoutCancel(ctx)); err != nil {
			log.Warn("cannot destroy the bench's sandboxes", "err", err)
		}
	}()

	b := &bencher{
		client:  httpapi.NewClient("http://"+a.Addr(), a.Token()),
		bwrap:   append([]string{bwrap}, bareBwrapArgs()...),
		timeout: opts.TaskTimeout,
		// 1 MiB under the default memory limit: no warm shape fits it.
		cold: &service.ResourceRequest{MemoryLimit: fmt.Sprintf("%dMi", cfg.AIWorker.Resources.MemoryLimit.Bytes()>>20-1)},
	}
	if opts.Warm > 0 {
		b.warm = a.WarmStats
	}
	if opts.Gvisor {
		if b.runsc, err = bareRunsc(runsc, filepath.Join(data, "bench-runsc")); err != nil {
			return nil, err
		}
	}
	if opts.DockerImage != "" {
		docker, err := exec.LookPath("docker")
		if err != nil {
			return nil, fmt.Errorf("bench with docker needs the docker CLI (install: apt-get install -y docker.io): %w", errdefs.ErrFailedPrecondition)
		}
		b.dockerRun = []string{docker, "-H", cfg.Docker.Host, "run", "--rm", "--network", "none", opts.DockerImage, "/bin/echo", "hi"}
	}
	commits := func() commitCount {
		c := a.Commits()
		return commitCount{c.Commits, c.Events, c.Seconds}
	}
	b.commits = func() uint64 { return a.Commits().Commits }
	start := commits()
	if err := b.sequential(ctx, opts, res); err != nil {
		return nil, err
	}
	mid := commits()
	if err := b.concurrent(ctx, opts, res); err != nil {
		return nil, err
	}
	res.SequentialCommits, res.ConcurrentCommits = commitsBetween(start, mid), commitsBetween(mid, commits())
	return res, nil
}

// bencher runs single measured operations.
type bencher struct {
	client *httpapi.Client
	bwrap  []string
	runsc  []string // runsc and its flags up to "run"; nil without gvisor
	// dockerRun is the bare docker run of echo hi; nil without docker.
	dockerRun []string
	runs      atomic.Int64
	timeout   time.Duration
	// cold are the resources of a task that no warm sandbox fits.
	cold *service.ResourceRequest
	// warm reports the server's warm pools; nil without them.
	warm func() []httpapi.WarmPool
	// commits counts the server's event log commits so far.
	commits func() uint64
}

// claims is how many tasks the warm pools have handed sandboxes to.
func (b *bencher) claims() uint64 {
	var n uint64
	for _, p := range b.warm() {
		n += p.Claims
	}
	return n
}

// waitWarm waits until every warm pool holds its target, as on a server
// that had a moment since its last task; at once without pools.
func (b *bencher) waitWarm(ctx context.Context) error {
	if b.warm == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	for {
		pools := b.warm()
		full := len(pools) > 0 // none yet: the server is starting them
		for _, p := range pools {
			full = full && p.Ready >= p.Target && p.Target > 0
		}
		if full {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the warm pools did not fill within %s: %+v", b.timeout, b.warm())
		case <-time.After(time.Millisecond):
		}
	}
}

// taskRun is one task's measured run.
type taskRun struct {
	total   time.Duration
	phases  [5]time.Duration // as in TaskPhases
	commits uint64           // the server's commits from the POST to the result
}

// runTask spawns ["echo","hi"] on runtime ("" for the default), with the
// default resources or, cold, b.cold, and long-polls its result until it
// ends. With phases it then reads the task's events (after the clock
// stopped) to split the time.
func (b *bencher) runTask(ctx context.Context, runtime string, cold, phases bool) (taskRun, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	req := service.SpawnRequest{
		TaskDescription: "bench: echo hi",
		Agent:           task.AgentCommand,
		Runtime:         runtime,
		Command:         []string{"echo", "hi"},
	}
	if cold {
		req.Resources = b.cold
	}
	c0, t0 := b.commits(), time.Now()
	tk, _, err := b.client.Spawn(ctx, req)
	if err != nil {
		return taskRun{}, fmt.Errorf("spawn bench task: %w", err)
	}
	var r service.Result
	for !r.Done {
		r, err = b.client.Result(ctx, service.ResultRequest{TaskID: tk.ID, Wait: min(b.timeout, service.MaxWait)})
		if err != nil {
			return taskRun{}, fmt.Errorf("result of bench task %s: %w", tk.ID, err)
		}
		if !r.Done && ctx.Err() != nil {
			return taskRun{}, fmt.Errorf("bench task %s did not end within %s: status %s", tk.ID, b.timeout, r.Status)
		}
	}
	t1, c1 := time.Now(), b.commits()
	if r.Status != task.Success || strings.TrimSpace(r.Summary) != "hi" {
		return taskRun{}, fmt.Errorf("bench task %s: status %s, summary %q (%s), want success and hi", tk.ID, r.Status, r.Summary, r.ErrorMessage)
	}
	run := taskRun{total: t1.Sub(t0), commits: c1 - c0}
	if !phases {
		return run, nil
	}
	at := map[string]time.Time{}
	err = b.client.Events(ctx, service.EventsRequest{TaskID: tk.ID}, func(e eventstore.Event) error {
		if _, ok := at[e.Type]; !ok {
			at[e.Type] = e.RecordedAt
		}
		return nil
	})
	if err != nil {
		return taskRun{}, fmt.Errorf("events of bench task %s: %w", tk.ID, err)
	}
	if at[task.EventStarted].IsZero() && runtime != "" {
		// The worker reported before the runtime's Create returned (gvisor
		// waits for runsc to report the container running), and the
		// scheduler records no start then: the sandbox phase holds the run.
		at[task.EventStarted] = at[task.EventCompleted]
	}
	cuts := []time.Time{t0, at[task.EventCreated], at[task.EventStarting], at[task.EventStarted], at[task.EventCompleted], t1}
	for i := range run.phases {
		if cuts[i].IsZero() || cuts[i+1].IsZero() {
			return taskRun{}, fmt.Errorf("bench task %s: events lack the phase ends %v", tk.ID, cuts)
		}
		run.phases[i] = cuts[i+1].Sub(cuts[i])
	}
	return run, nil
}

// runExec runs code_execute of echo hi on runtime, POST to answer.
func (b *bencher) runExec(ctx context.Context, runtime string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	t0 := time.Now()
	res, err := b.client.Execute(ctx, service.ExecRequest{Command: "echo hi", Runtime: runtime})
	if err != nil {
		return 0, fmt.Errorf("bench code_execute on %s: %w", runtime, err)
	}
	d := time.Since(t0)
	if !res.Success || res.Stdout != "hi\n" {
		return 0, fmt.Errorf("bench code_execute on %s (%s): %s, stdout %q (%s), want success and hi", runtime, res.TaskID, res.Status, res.Stdout, res.Error)
	}
	return d, nil
}

// runBwrap runs the bare sandbox once, from start to exit.
func (b *bencher) runBwrap(ctx context.Context) (time.Duration, error) {
	return b.timeEcho(ctx, "bwrap", b.bwrap)
}

// timeEcho runs argv, a bare sandbox running /bin/echo hi, once, and
// times it; the run must print hi.
func (b *bencher) timeEcho(ctx context.Context, name string, argv []string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = &out, &out
	t0 := time.Now()
	err := cmd.Run()
	d := time.Since(t0)
	if err != nil {
		return 0, fmt.Errorf("run bare %s: %w: %s", name, err, strings.TrimSpace(out.String()))
	}
	if got := strings.TrimSpace(out.String()); got != "hi" {
		return 0, fmt.Errorf("bare %s printed %q, want hi", name, got)
	}
	return d, nil
}

// bareRunsc writes the bundle for bare runsc runs into dir (the host's /usr
// read-only with the merged-/usr symlinks, /bin/echo hi as root's user
// 1000, no cgroups, the platform the runtime picks) and returns runsc's
// argv up to the container id.
func bareRunsc(runsc, dir string) ([]string, error) {
	rootfs := filepath.Join(dir, "bundle", "rootfs")
	if err := os.MkdirAll(filepath.Join(rootfs, "usr"), 0o755); err != nil {
		return nil, fmt.Errorf("create bare runsc bundle: %w", err)
	}
	mounts := []map[string]any{{"destination": "/usr", "type": "bind", "source": "/usr", "options": []string{"rbind", "ro"}}}
	for _, d := range []string{"/bin", "/lib", "/lib64"} {
		fi, err := os.Lstat(d)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			if target, err := os.Readlink(d); err == nil {
				os.Symlink(target, filepath.Join(rootfs, d))
			}
		case fi.IsDir():
			os.MkdirAll(filepath.Join(rootfs, d), 0o755)
			mounts = append(mounts, map[string]any{"destination": d, "type": "bind", "source": d, "options": []string{"rbind", "ro"}})
		}
	}
	spec := map[string]any{
		"ociVersion": "1.0.2",
		"process":    map[string]any{"user": map[string]int{"uid": 1000, "gid": 1000}, "args": []string{"/bin/echo", "hi"}, "cwd": "/", "env": []string{"PATH=/usr/bin:/bin"}},
		"root":       map[string]any{"path": "rootfs", "readonly": true},
		"mounts":     mounts,
		"linux":      map[string]any{"namespaces": []map[string]string{{"type": "pid"}, {"type": "network"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}}},
	}
	js, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("encode bare runsc bundle: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bundle", "config.json"), js, 0o600); err != nil {
		return nil, fmt.Errorf("write bare runsc bundle: %w", err)
	}
	return []string{runsc, "--root=" + filepath.Join(dir, "root"), "--platform=" + gvisor.DefaultPlatform(runsc), "--network=none",
		"run", "--bundle", filepath.Join(dir, "bundle")}, nil
}

// runRunsc runs the bare gVisor sandbox once, from start to exit.
func (b *bencher) runRunsc(ctx context.Context) (time.Duration, error) {
	return b.timeEcho(ctx, "runsc", append(slices.Clone(b.runsc), fmt.Sprintf("bench-%d-%d", os.Getpid(), b.runs.Add(1))))
}

// bareBwrapArgs is the sandbox Corral's overhead is measured against: every
// namespace, the host's /usr read-only with the merged-/usr symlinks (or
// binds where /bin and /lib* are directories), its own /proc and /dev.
func bareBwrapArgs() []string {
	args := []string{"--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr"}
	for _, d := range []string{"/bin", "/lib", "/lib64"} {
		fi, err := os.Lstat(d)
		switch {
		case err != nil:
		case fi.Mode()&os.ModeSymlink != 0:
			if target, err := os.Readlink(d); err == nil {
				args = append(args, "--symlink", target, d)
			}
		case fi.IsDir():
			args = append(args, "--ro-bind", d, d)
		}
	}
	return append(args, "--proc", "/proc", "--dev", "/dev", "/bin/echo", "hi")
}

// runWarm runs a task on runtime ("" for the default) with the default
// resources into a full pool, which it must claim from; the refill it
// starts ends before it returns, and so before the next measurement.
func (b *bencher) runWarm(ctx context.Context, runtime string) (taskRun, error) {
	if err := b.waitWarm(ctx); err != nil {
		return taskRun{}, err
	}
	claims := b.claims()
	wr, err := b.runTask(ctx, runtime, false, true)
	if err != nil {
		return taskRun{}, err
	}
	if b.claims() != claims+1 {
		return taskRun{}, fmt.Errorf("the warm bench task on %q started cold: no warm sandbox's shape fits it", runtime)
	}
	return wr, b.waitWarm(ctx)
}

// sequential runs warm-up and then n task/bwrap pairs, one at a time.
func (b *bencher) sequential(ctx context.Context, opts Options, res *Result) error {
	var local, gv, dk series
	var bares, runscs []time.Duration
	var execs [3][]time.Duration // local, docker, bare docker run
	for i := range opts.Warmup + opts.N {
		measured := i >= opts.Warmup
		if err := b.round(ctx, "", &local, measured); err != nil {
			return err
		}
		d, err := b.runBwrap(ctx)
		if err != nil {
			return err
		}
		if measured {
			bares = append(bares, d)
		}
		if b.runsc != nil {
			if err := b.round(ctx, rtkind.GVisor, &gv, measured); err != nil {
				return err
			}
			rd, err := b.runRunsc(ctx)
			if err != nil {
				return err
			}
			if measured {
				runscs = append(runscs, rd)
			}
		}
		if b.dockerRun != nil {
			var ds [3]time.Duration
			var err error
			if ds[0], err = b.runExec(ctx, rtkind.Local); err != nil {
				return err
			}
			if ds[1], err = b.runExec(ctx, rtkind.Docker); err != nil {
				return err
			}
			if ds[2], err = b.timeEcho(ctx, "docker run", b.dockerRun); err != nil {
				return err
			}
			if err := b.round(ctx, rtkind.Docker, &dk, measured); err != nil {
				return err
			}
			if measured {
				for j, d := range ds {
					execs[j] = append(execs[j], d)
				}
			}
		}
	}
	s := &res.Sequential
	s.Bwrap = summarise(bares)
	s.Tasks = local.tasks(s.Bwrap)
	if b.runsc != nil {
		runsc := summarise(runscs)
		s.Gvisor = &Gvisor{Tasks: gv.tasks(runsc), Runsc: runsc}
	}
	if b.dockerRun != nil {
		e := &Exec{Local: summarise(execs[0]), Docker: summarise(execs[1]), DockerRun: summarise(execs[2])}
		e.LocalRatio, e.DockerRatio = ratio(e.Local, s.Bwrap), ratio(e.Docker, e.DockerRun)
		res.Exec = e
		s.Docker = &Docker{Tasks: dk.tasks(e.DockerRun)}
	}
	return nil
}

// series are one runtime's measured tasks, cold and (with warm pools) warm.
type series struct{ cold, warm []taskRun }

// round runs one sequential round's tasks on runtime ("" for the
// default): into a full warm pool if the server keeps one, then cold; the
// measured ones go into s.
func (b *bencher) round(ctx context.Context, runtime string, s *series, measured bool) error {
	if b.warm != nil {
		wr, err := b.runWarm(ctx, runtime)
		if err != nil {
			return err
		}
		if measured {
			s.warm = append(s.warm, wr)
		}
	}
	tr, err := b.runTask(ctx, runtime, true, true)
	if err != nil {
		return err
	}
	if measured {
		s.cold = append(s.cold, tr)
	}
	return nil
}

// tasks summarises s beside bare, the median of the bare sandbox of the
// same rounds.
func (s series) tasks(bare Latency) Tasks {
	t := Tasks{Task: summarise(totals(s.cold)), Phases: medianPhases(s.cold)}
	t.Ratio = ratio(t.Task, bare)
	if s.warm != nil {
		w, wp := summarise(totals(s.warm)), medianPhases(s.warm)
		t.Warm, t.WarmPhases, t.WarmRatio = &w, &wp, ratio(w, bare)
	}
	return t
}

func totals(runs []taskRun) []time.Duration {
	ds := make([]time.Duration, len(runs))
	for i, r := range runs {
		ds[i] = r.total
	}
	return ds
}

// ratio is l's median over bare's, 0 without a bare median.
func ratio(l, bare Latency) float64 {
	if bare.Median <= 0 {
		return 0
	}
	return l.Median / bare.Median
}

// medianPhases are the medians of runs' phases and commits.
func medianPhases(runs []taskRun) TaskPhases {
	var p [5][]time.Duration
	commits := make([]float64, len(runs))
	for i, r := range runs {
		for j, d := range r.phases {
			p[j] = append(p[j], d)
		}
		commits[i] = float64(r.commits)
	}
	slices.Sort(commits)
	return TaskPhases{
		Commits: median(commits),
		Submit:  summarise(p[0]).Median,
		Queue:   summarise(p[1]).Median,
		Sandbox: summarise(p[2]).Median,
		Run:     summarise(p[3]).Median,
		Deliver: summarise(p[4]).Median,
	}
}

// concurrent runs n tasks, then n bare bwraps, from Concurrency clients.
func (b *bencher) concurrent(ctx context.Context, opts Options, res *Result) error {
	c := &res.Concurrent
	if opts.CPUProfile != nil {
		if err := pprof.StartCPUProfile(opts.CPUProfile); err != nil {
			return fmt.Errorf("start the CPU profile: %w", err)
		}
	}
	var err error
	c.Task, err = b.phase(ctx, opts.N, opts.Concurrency, func(ctx context.Context) error {
		_, err := b.runTask(ctx, "", true, false)
		return err
	})
	if opts.CPUProfile != nil {
		pprof.StopCPUProfile()
	}
	if err != nil {
		return err
	}
	if b.warm != nil {
		w, err := b.phase(ctx, opts.N, opts.Concurrency, func(ctx context.Context) error {
			_, err := b.runTask(ctx, "", false, false)
			return err
		})
		if err != nil {
			return err
		}
		c.Warm = &w
	}
	if c.Bwrap, err = b.phase(ctx, opts.N, opts.Concurrency, func(ctx context.Context) error {
		_, err := b.runBwrap(ctx)
		return err
	}); err != nil {
		return err
	}
	if c.Task.PerSecond > 0 {
		c.Ratio = c.Bwrap.PerSecond / c.Task.PerSecond
	}
	return nil
}

// phase runs f n times from workers goroutines (fanOut) and measures the
// wall time and the CPU time (see Throughput). It starts with the warm
// pools full and ends once they are full again and every sandbox started
// meanwhile is gone but theirs, so that the CPU counted is the phase's:
// the launcher of each sandbox the phase ended is reaped, and a sandbox
// the pools started during it stands for one of theirs from before that
// a task took.
func (b *bencher) phase(ctx context.Context, n, workers int, f func(context.Context) error) (Throughput, error) {
	if err := b.waitWarm(ctx); err != nil {
		return Throughput{}, err
	}
	kids, cpu0 := children(), cpuTime()
	tp, err := fanOut(ctx, n, workers, f)
	if err != nil {
		return tp, err
	}
	if err := b.waitWarm(ctx); err != nil {
		return Throughput{}, err
	}
	settle, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	for children() > kids {
		select {
		case <-settle.Done():
			return Throughput{}, fmt.Errorf("%d sandboxes of the phase are still there after %s", children()-kids, b.timeout)
		case <-time.After(time.Millisecond):
		}
	}
	tp.CPU = ms(cpuTime()-cpu0) / float64(tp.Completed)
	return tp, nil
}

// children counts this process's child processes: the launchers of the
// server's sandboxes, and the bare sandboxes running.
func children() int {
	n := 0
	threads, _ := filepath.Glob("/proc/self/task/*/children")
	for _, t := range threads {
		b, _ := os.ReadFile(t)
		n += len(strings.Fields(string(b)))
	}
	return n
}

// cpuTime is the busy time of all the host's CPUs since boot: user, nice,
// system, irq and softirq time in /proc/stat, counted in USER_HZ (100)
// ticks; 0 if it cannot be read.
func cpuTime() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line) // cpu user nice system idle iowait irq softirq ...
	var ticks int64
	for i, v := range f {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && (i == 1 || i == 2 || i == 3 || i == 6 || i == 7) {
			ticks += n
		}
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// fanOut runs f n times from workers goroutines and measures the wall time.
// The first error stops every worker and is returned.
func fanOut(ctx context.Context, n, workers int, f func(context.Context) error) (Throughput, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next, done atomic.Int64
		wg         sync.WaitGroup
		errOnce    sync.Once
		first      error
	)
	t0 := time.Now()
	for range min(workers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) && ctx.Err() == nil {
				if err := f(ctx); err != nil {
					errOnce.Do(func() { first = err; cancel() })
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	wall := time.Since(t0)
	if first != nil {
		return Throughput{}, first
	}
	if err := ctx.Err(); err != nil {
		return Throughput{}, fmt.Errorf("bench interrupted: %w", err)
	}
	tp := Throughput{Completed: int(done.Load()), Wall: ms(wall)}
	tp.PerSecond = float64(tp.Completed) / wall.Seconds()
	return tp, nil
}

// summarise returns the count, median (the mean of the two middle values
// for an even count), nearest-rank 90th percentile, minimum and maximum.
func summarise(ds []time.Duration) Latency {
	if len(ds) == 0 {
		return Latency{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	p90 := s[int(math.Ceil(0.9*float64(n)))-1]
	return Latency{Count: n, Median: ms(med), P90: ms(p90), Min: ms(s[0]), Max: ms(s[n-1])}
}

// median is the middle of sorted values, the mean of the two middle ones
// for an even count; 0 for none.
func median(s []float64) float64 {
	n := len(s)
	switch {
	case n == 0:
		return 0
	case n%2 == 0:
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[n/2]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func benchHost(bwrap string) Host {
	h := Host{CPUs: runtime.NumCPU()}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		h.Kernel = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		h.LoadAvg = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	if out, err := exec.Command(bwrap, "--version").Output(); err == nil {
		h.Bwrap = strings.TrimSpace(string(out))
	}
	return h
}
