package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/bench"
	"github.com/corral-dev/corral/internal/config"
)

// benchCmd is corral bench: task overhead against bare bubblewrap; corral
// bench cluster: the event stores and replicas on PostgreSQL.
func benchCmd() *cobra.Command {
	var (
		opts       bench.Options
		cpuProfile string
		asJSON     bool
		verbose    bool
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure task overhead against bare bubblewrap (bench cluster: on PostgreSQL)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBench(cmd.Context(), opts, cpuProfile, asJSON, verbose, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.IntVarP(&opts.N, "n", "n", 200, "measured runs of each kind, per phase")
	f.IntVar(&opts.Concurrency, "concurrency", 16, "clients in the concurrent phase (and the server's max_concurrent_workers)")
	f.IntVar(&opts.Warmup, "warmup", 5, "unmeasured runs of each kind first")
	f.StringVar(&opts.Data, "data", "", "the server's data root (default: a temporary directory, removed afterwards)")
	f.StringVar(&opts.Bwrap, "bwrap", "bwrap", "the bubblewrap binary")
	f.BoolVar(&opts.Gvisor, "gvisor", false, "also run each sequential round's task under the gvisor runtime, beside a bare runsc run")
	f.StringVar(&opts.Runsc, "runsc", "runsc", "the runsc binary (with --gvisor)")
	f.StringVar(&opts.DockerImage, "docker", "", "also run code_execute of echo hi on local and on docker, and the task echo hi on docker (cold and warm), in this image each round, beside a bare docker run --rm of it")
	f.IntVar(&opts.Warm, "warm", config.AutoWarmPool, "warm sandboxes per shape the server keeps (-1: none, and no warm figures)")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the server and the clients over the concurrent cold tasks to this file (go tool pprof)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.BoolVarP(&verbose, "verbose", "v", false, "show the server's log")
	cmd.AddCommand(benchClusterCmd())
	return cmd
}

func runBench(ctx context.Context, opts bench.Options, cpuProfile string, asJSON, verbose bool, stdout, stderr io.Writer) error {
	if opts.N < 1 || opts.Concurrency < 1 || opts.Warmup < 0 {
		return usagef("--n and --concurrency must be at least 1, --warmup at least 0")
	}
	if opts.Warmup == 0 {
		opts.Warmup = -1 // BenchOptions: zero means the default
	}
	lvl := slog.LevelWarn
	if verbose {
		lvl = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	if !asJSON {
		fmt.Fprintf(stdout, "corral bench: %d runs of each kind per phase, %d concurrent clients, %d warm-up runs\n", opts.N, opts.Concurrency, max(opts.Warmup, 0))
	}
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer f.Close()
		opts.CPUProfile = f
	}
	res, err := bench.Run(ctx, opts, log)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(stdout, res)
	}
	printBench(stdout, res)
	return nil
}

func printBench(w io.Writer, r *bench.Result) {
	h := r.Host
	fmt.Fprintf(w, "host: %d CPUs, kernel %s, %s, load average %s\n\n", h.CPUs, h.Kernel, h.Bwrap, h.LoadAvg)
	s := r.Sequential
	fmt.Fprintf(w, "sequential (one at a time, interleaved)   median      p90      min      max\n")
	row := func(name string, l bench.Latency) {
		fmt.Fprintf(w, "  %-38s %6.1f ms %6.1f ms %6.1f ms %6.1f ms\n", name, l.Median, l.P90, l.Min, l.Max)
	}
	phases := func(name string, p bench.TaskPhases) {
		fmt.Fprintf(w, "  %s median by phase: submit %.1f, queue %.1f, sandbox create %.1f, worker run %.1f, deliver %.1f ms; %g event log commits from POST to result\n",
			name, p.Submit, p.Queue, p.Sandbox, p.Run, p.Deliver, p.Commits)
	}
	// tasks prints one runtime's task rows, bare's rows between the task
	// rows and the ratios.
	tasks := func(runtime, label string, t bench.Tasks, bare func(), bareName, warmTarget, coldTarget string) {
		if t.Warm != nil {
			row("warm task echo hi, "+label, *t.Warm)
		}
		row("cold task echo hi, "+label, t.Task)
		bare()
		if t.Warm != nil {
			fmt.Fprintf(w, "  %swarm over %s: %.2f (%s)\n", runtime, bareName, t.WarmRatio, warmTarget)
		}
		fmt.Fprintf(w, "  %scold over %s: %.2f%s\n", runtime, bareName, t.Ratio, coldTarget)
		if t.WarmPhases != nil {
			phases(runtime+"warm task", *t.WarmPhases)
		}
		phases(runtime+"cold task", t.Phases)
	}
	tasks("", "POST to result", s.Tasks, func() { row("bare bwrap /bin/echo hi", s.Bwrap) },
		"bare bwrap", "issue 41's target: <= 1.5", " (issue 41's target: <= 3)")
	if g := s.Gvisor; g != nil {
		tasks("gvisor ", "runtime gvisor", g.Tasks, func() { row("bare runsc run /bin/echo hi", g.Runsc) },
			"bare runsc run", "issue 41's target: <= 0.25", "")
	}
	if e := r.Exec; e != nil {
		row("code_execute echo hi, runtime local", e.Local)
		row("code_execute echo hi, runtime docker", e.Docker)
		row("bare docker run --rm IMAGE echo hi", e.DockerRun)
		fmt.Fprintf(w, "  code_execute local over bare bwrap: %.2f; docker over bare docker run: %.2f (target <= 1.2)\n", e.LocalRatio, e.DockerRatio)
	}
	if d := s.Docker; d != nil {
		tasks("docker ", "runtime docker", d.Tasks, func() {}, "bare docker run",
			"issue 41's target: <= 0.1", " (issue 41's target: <= 1.1)")
	}
	commits := func(c bench.Commits) {
		fmt.Fprintf(w, "  event log: %d commits of %.1f events on average, %.2f ms each with its fsync\n", c.Commits, c.EventsPerCommit, c.MeanMS)
	}
	commits(r.SequentialCommits)
	fmt.Fprintln(w)
	c := r.Concurrent
	fmt.Fprintf(w, "concurrent (%d clients)                   done     wall      per second   CPU per run\n", r.Concurrency)
	trow := func(name string, t bench.Throughput) {
		fmt.Fprintf(w, "  %-38s %4d %7.2f s %9.1f /s %10.1f ms\n", name, t.Completed, t.Wall/1000, t.PerSecond, t.CPU)
	}
	if c.Warm != nil {
		trow("warm tasks (claims and refills)", *c.Warm)
	}
	trow("cold tasks", c.Task)
	trow("bare bwrap", c.Bwrap)
	fmt.Fprintf(w, "  bare over cold tasks: %.2f; tasks per second target (issue 17, 16 clients on 2 cores): >= 100\n", c.Ratio)
	commits(r.ConcurrentCommits)
	fmt.Fprintf(w, "  CPU per run bounds runs per second on %d cores at %d000 / CPU ms; 100 tasks/s there takes <= %.1f ms\n", r.Host.CPUs, r.Host.CPUs, float64(r.Host.CPUs)*10)
}

// benchClusterCmd is corral bench cluster.
func benchClusterCmd() *cobra.Command {
	var (
		opts    bench.ClusterOptions
		asJSON  bool
		verbose bool
	)
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Measure the event stores and replicas on PostgreSQL",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBenchCluster(cmd.Context(), opts, asJSON, verbose, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.AdminDSN, "dsn", "host=/var/run/postgresql dbname=postgres", "a PostgreSQL connection string of a role that may create databases (each measure gets one of its own, dropped after)")
	f.IntVar(&opts.Appends, "appends", 4000, "events appended to each store")
	f.IntVar(&opts.Tasks, "tasks", 60, "tasks in each throughput run")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.BoolVarP(&verbose, "verbose", "v", false, "show the replicas' warnings")
	return cmd
}

func runBenchCluster(ctx context.Context, opts bench.ClusterOptions, asJSON, verbose bool, stdout, stderr io.Writer) error {
	if verbose {
		opts.ServerLog = stderr
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	res, err := bench.RunCluster(ctx, opts, log)
	if err != nil {
		return err
	}
	if asJSON {
		return printJSON(stdout, res)
	}
	fmt.Fprintf(stdout, "event appends/s (16 appenders):  SQLite %.0f   PostgreSQL %.0f\n", res.AppendsPerSecond["sqlite"], res.AppendsPerSecond["postgres"])
	fmt.Fprintf(stdout, "tasks/s (%d tasks of true, 8 clients): 1 replica %.1f   3 replicas %.1f\n", opts.Tasks, res.TasksPerSecond[1], res.TasksPerSecond[3])
	fmt.Fprintf(stdout, "failover (SIGKILL to the first task_adopted a survivor sees): %s, %d tasks adopted\n", res.Failover.Round(time.Millisecond), res.Adopted)
	return nil
}
