package projection

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/postgres"
	"github.com/corral-dev/corral/internal/eventstore/postgres/postgrestest"
	"github.com/corral-dev/corral/internal/eventstore/sqlite"
	"github.com/corral-dev/corral/internal/task"
)

var (
	startEnded   = flag.String("start.ended", "1000,100000", "BenchmarkStart: the numbers of ended tasks, comma-separated")
	startDrivers = flag.String("start.drivers", "sqlite", "BenchmarkStart: the stores, comma-separated: sqlite, postgres")
)

// startTail is how many tasks end after the checkpoint: the events a
// start applies after it (5 each), as after a stop moments after a save.
const startTail = 20

// BenchmarkStart measures a server's start over a store of n ended tasks
// (each with the five events corral bench's tasks leave, as fillStore
// makes them), startTail of them ended after the checkpoint: the store's
// Open, then Rebuild, without a checkpoint (full: the whole log folded)
// and with one (checkpoint: its head read, the events after it applied).
// It reports, as medians, start-ms (Open and Rebuild: when a server can
// serve), open-ms, and for a start from a checkpoint archive-ms (from the
// start until the archive of ended tasks is read in the background) and
// the checkpoint's size. docs/benchmarks.md has figures and the command.
func BenchmarkStart(b *testing.B) {
	var sizes []int
	for _, s := range strings.Split(*startEnded, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			b.Fatalf("-start.ended: %v", err)
		}
		sizes = append(sizes, n)
	}
	ctx := context.Background()
	for _, driver := range strings.Split(*startDrivers, ",") {
		b.Run(driver, func(b *testing.B) {
			for _, n := range sizes {
				var open func() (checkpointStore, error)
				switch driver {
				case "sqlite":
					path := filepath.Join(b.TempDir(), "corral.db")
					open = func() (checkpointStore, error) { return sqlite.Open(ctx, path, discard()) }
				case "postgres":
					dsn := postgrestest.New(b).DSN
					open = func() (checkpointStore, error) { return postgres.Open(ctx, dsn, discard()) }
				default:
					b.Fatalf("-start.drivers: no store %q", driver)
				}
				size := fillForStart(b, open, n)
				b.Run(fmt.Sprintf("ended=%d/full", n), func(b *testing.B) {
					measureStart(b, open, n, false)
				})
				b.Run(fmt.Sprintf("ended=%d/checkpoint", n), func(b *testing.B) {
					measureStart(b, open, n, true)
					b.ReportMetric(float64(size)/(1<<20), "checkpoint-MiB")
				})
			}
		})
	}
}

// fillForStart fills a store with n ended tasks, saves a checkpoint, ends
// startTail more, and returns the checkpoint's size.
func fillForStart(b *testing.B, open func() (checkpointStore, error), n int) int {
	b.Helper()
	ctx := context.Background()
	s, err := open()
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	start := time.Now()
	fillStore(b, s, n)
	filled := time.Since(start)
	p := New(withoutCheckpoints{s}, discard())
	if err := p.Rebuild(ctx); err != nil {
		b.Fatal(err)
	}
	p.store = s
	var log logged
	p.log = slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if err := p.SaveCheckpoint(ctx); err != nil {
		b.Fatal(err)
	}
	fillStore(b, s, startTail)
	size := 0
	for _, name := range []string{headName, archiveName} {
		_, data, _, err := s.LoadCheckpoint(ctx, name)
		if err != nil {
			b.Fatal(err)
		}
		size += len(data)
	}
	b.Logf("%d ended tasks: filled in %v; %s", n, filled.Round(time.Millisecond), strings.TrimSpace(log.String()))
	return size
}

// measureStart opens the store and rebuilds a projection over it, with
// its checkpoint or without, and reports the medians.
func measureStart(b *testing.B, open func() (checkpointStore, error), n int, withCheckpoint bool) {
	ctx := context.Background()
	var starts, opens, archives []time.Duration
	for b.Loop() {
		start := time.Now()
		s, err := open()
		if err != nil {
			b.Fatal(err)
		}
		opened := time.Since(start)
		var store eventstore.Store = withoutCheckpoints{s}
		if withCheckpoint {
			store = s
		}
		p := New(store, discard())
		if err := p.Rebuild(ctx); err != nil {
			b.Fatal(err)
		}
		started := time.Since(start)
		<-p.Archived()
		archived := time.Since(start)
		b.StopTimer()
		if c := p.Counts(); c[task.Success] != n+startTail {
			b.Fatalf("started with %v, want %d successes", c, n+startTail)
		}
		if got, _, err := p.List(Filter{Limit: 1}); err != nil || len(got) != 1 {
			b.Fatalf("List after the start: %v, %v", got, err)
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		runtime.GC() // each start with the clean heap of a process that has just begun
		b.StartTimer()
		starts, opens, archives = append(starts, started), append(opens, opened), append(archives, archived)
	}
	median := func(ds []time.Duration) float64 {
		slices.Sort(ds)
		return float64(ds[len(ds)/2]) / float64(time.Millisecond)
	}
	b.ReportMetric(median(starts), "start-ms")
	b.ReportMetric(median(opens), "open-ms")
	if withCheckpoint {
		b.ReportMetric(median(archives), "archive-ms")
	}
}
