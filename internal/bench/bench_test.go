//go:build integration

package bench_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/bench"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestBench runs the benchmark with a tiny count and checks that it
// measured what it claims: every run succeeded (Run fails otherwise),
// each kind was counted n times, and the figures are positive and ordered.
// It does not check the performance targets: they depend on the machine.
func TestBench(t *testing.T) {
	testenv.RequireBwrap(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n, clients = 3, 2
	res, err := bench.Run(ctx, bench.Options{
		N: n, Concurrency: clients, Warmup: 1,
		Data: testenv.TempDir(t), Binary: corralBin,
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if res.N != n || res.Concurrency != clients || res.Warmup != 1 {
		t.Errorf("n %d, concurrency %d, warmup %d; want %d, %d, 1", res.N, res.Concurrency, res.Warmup, n, clients)
	}
	s := res.Sequential
	for name, l := range map[string]bench.Latency{"task": s.Task, "bwrap": s.Bwrap} {
		if l.Count != n {
			t.Errorf("sequential %s: %d runs counted, want %d", name, l.Count, n)
		}
		if !(l.Min > 0 && l.Min <= l.Median && l.Median <= l.P90 && l.P90 <= l.Max) {
			t.Errorf("sequential %s: want 0 < min <= median <= p90 <= max, got %+v", name, l)
		}
	}
	if want := s.Task.Median / s.Bwrap.Median; s.Ratio != want || s.Ratio <= 0 {
		t.Errorf("ratio %v, want task median over bwrap median %v", s.Ratio, want)
	}
	p := s.Phases
	sum := p.Submit + p.Queue + p.Sandbox + p.Run + p.Deliver
	if p.Sandbox <= 0 || p.Run <= 0 || sum <= 0 {
		t.Errorf("phases %+v: want a positive sandbox and run phase", p)
	}
	// Warm: Run fails if a warm round's task did not claim a sandbox.
	if s.Warm == nil || s.WarmPhases == nil || res.Concurrent.Warm == nil {
		t.Fatal("no warm figures with the default pool")
	}
	if w := *s.Warm; w.Count != n || !(w.Min > 0 && w.Min <= w.Median && w.Median <= w.P90 && w.P90 <= w.Max) {
		t.Errorf("sequential warm: %+v, want %d ordered positive runs", w, n)
	}
	if want := s.Warm.Median / s.Bwrap.Median; s.WarmRatio != want || s.WarmRatio <= 0 {
		t.Errorf("warm ratio %v, want warm median over bwrap median %v", s.WarmRatio, want)
	}
	if s.WarmPhases.Sandbox <= 0 || s.WarmPhases.Run <= 0 {
		t.Errorf("warm phases %+v: want a positive sandbox and run phase", *s.WarmPhases)
	}
	c := res.Concurrent
	for name, tp := range map[string]bench.Throughput{"task": c.Task, "warm": *c.Warm, "bwrap": c.Bwrap} {
		if tp.Completed != n || tp.Wall <= 0 || tp.PerSecond <= 0 {
			t.Errorf("concurrent %s: %+v, want %d completed in a positive time", name, tp, n)
		}
		// A bare bwrap's few milliseconds of CPU can fall between two
		// of /proc/stat's 10 ms ticks; a task's tens cannot.
		if tp.CPU < 0 || name != "bwrap" && tp.CPU <= 0 {
			t.Errorf("concurrent %s: CPU per run %v ms, want a positive figure", name, tp.CPU)
		}
	}
	// The sequential phase ran a warm and a cold task per round, warm-up
	// included, one at a time: each commits at least its creation and
	// its end. The concurrent one ran 2n tasks.
	for name, c := range map[string]struct {
		bench.Commits
		min uint64
	}{"sequential": {res.SequentialCommits, 2 * 2 * (n + 1)}, "concurrent": {res.ConcurrentCommits, 2}} {
		if c.Commits.Commits < c.min || c.EventsPerCommit < 1 || c.MeanMS <= 0 {
			t.Errorf("%s commits %+v: want at least %d, of one event or more, in a positive time", name, c.Commits, c.min)
		}
	}
	// A task waits for its acknowledgement's commit and its end's at
	// least; each phase's median counts them.
	for name, p := range map[string]bench.TaskPhases{"cold": s.Phases, "warm": *s.WarmPhases} {
		if p.Commits < 2 {
			t.Errorf("%s task: %v commits from POST to result, want 2 or more", name, p.Commits)
		}
	}
	if res.Host.CPUs < 1 || res.Host.Bwrap == "" {
		t.Errorf("host %+v: want CPUs and the bwrap version", res.Host)
	}
}

// TestBenchExec runs the code_execute rows and the docker task rows
// against a real engine with a tiny count and checks they were measured.
func TestBenchExec(t *testing.T) {
	testenv.RequireDocker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := bench.Run(ctx, bench.Options{
		N: 2, Concurrency: 1, Warmup: 1, Data: testenv.TempDir(t), Binary: corralBin,
		DockerImage: testenv.DockerImage, DockerHost: "unix://" + testenv.DockerSocket,
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	e := res.Exec
	if e == nil {
		t.Fatal("no code_execute figures")
	}
	for name, l := range map[string]bench.Latency{"local": e.Local, "docker": e.Docker, "docker run": e.DockerRun} {
		if l.Count != 2 || l.Min <= 0 {
			t.Errorf("%s: %+v, want 2 positive runs", name, l)
		}
	}
	if e.DockerRatio != e.Docker.Median/e.DockerRun.Median || e.LocalRatio <= 0 {
		t.Errorf("ratios %+v", e)
	}
	// The docker task rows, cold and into a warm pool (which runWarm
	// checks it claimed from).
	d := res.Sequential.Docker
	if d == nil || d.Warm == nil {
		t.Fatalf("docker task figures %+v, want cold and warm", d)
	}
	for name, l := range map[string]bench.Latency{"docker cold task": d.Task, "docker warm task": *d.Warm} {
		if l.Count != 2 || l.Min <= 0 {
			t.Errorf("%s: %+v, want 2 positive runs", name, l)
		}
	}
	if d.Ratio != d.Task.Median/e.DockerRun.Median || d.WarmRatio != d.Warm.Median/e.DockerRun.Median {
		t.Errorf("docker task ratios %+v, want over bare docker run's median %v", d, e.DockerRun.Median)
	}
}

// TestBenchCluster runs corral bench cluster with small counts: every
// measure ran (RunCluster fails otherwise), each figure is positive, and a
// replica killed had its tasks adopted. The failover's target is not
// checked here: timing depends on the machine.
func TestBenchCluster(t *testing.T) {
	testenv.RequireBwrap(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := bench.RunCluster(ctx, bench.ClusterOptions{AdminDSN: testenv.PostgresDSN(t), Binary: corralBin, Appends: 200, Tasks: 6},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []float64{res.AppendsPerSecond["sqlite"], res.AppendsPerSecond["postgres"], res.TasksPerSecond[1], res.TasksPerSecond[3]} {
		if !(f > 0) {
			t.Errorf("a figure is not positive: %+v", res)
		}
	}
	if res.Failover <= 0 || res.Adopted == 0 {
		t.Errorf("failover %s with %d tasks adopted; want some adopted after the kill", res.Failover, res.Adopted)
	}
}
