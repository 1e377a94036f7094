package projection

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/sqlite/sqlitetest"
	"github.com/corral-dev/corral/internal/task"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// fillTasks applies, without a store, the events of ended tasks and of
// queued ones, as a server that has run that many holds them.
func fillTasks(tb testing.TB, p *Tasks, ended, queued int) {
	tb.Helper()
	a := &applier{p: p, version: map[string]int64{}}
	for range ended {
		id := task.NewID()
		for _, e := range []eventstore.Proposed{created(task.Spec{Description: "chart my spending"}), ev(task.EventQueued), ev(task.EventStarting),
			NewEvent(task.EventStarted, task.Started{SandboxName: "sb", Handle: []byte(`{}`)}, "test"),
			NewEvent(task.EventCompleted, task.Completed{Status: task.Success, Summary: "done"}, "test")} {
			a.apply(id, e)
		}
	}
	a.queued(queued)
	if c := p.Counts(); c[task.Success] != ended || c[task.Queued] != queued {
		tb.Fatalf("Counts after filling = %v, want %d success and %d queued", c, ended, queued)
	}
}

// BenchmarkScale measures what a server that has run 100,000 tasks pays on
// each event and spawn (the scheduler's look for queued tasks, the queue's
// count), on each page of the task list and each look at /metrics or
// /api/health (what ended tasks reported), beside a plain walk over the
// same 100,000 tasks.
func BenchmarkScale(b *testing.B) {
	const ended, queued = 100_000, 16
	p := New(nil, discard())
	fillTasks(b, p, ended, queued)
	b.Run("select-queued", func(b *testing.B) {
		for b.Loop() {
			if got := p.SelectLive(func(t *task.Task) bool { return t.Status == task.Queued }); len(got) != queued {
				b.Fatalf("%d queued, want %d", len(got), queued)
			}
		}
	})
	b.Run("counts", func(b *testing.B) {
		for b.Loop() {
			if c := p.Counts(); c[task.Queued] != queued {
				b.Fatal(c)
			}
		}
	})
	b.Run("list-first-page", func(b *testing.B) {
		for b.Loop() {
			if got, more := mustList(b, p, Filter{Limit: 50}); len(got) != 50 || !more {
				b.Fatal(len(got), more)
			}
		}
	})
	b.Run("ended", func(b *testing.B) {
		for b.Loop() {
			if e := p.Ended(); e.Timed != ended {
				b.Fatal(e.Timed)
			}
		}
	})
	b.Run("walk-all", func(b *testing.B) {
		for b.Loop() {
			p.mu.RLock()
			n := 0
			for _, t := range p.tasks {
				if t.Status == task.Queued {
					n++
				}
			}
			p.mu.RUnlock()
			if n != queued {
				b.Fatal(n)
			}
		}
	})
}

// TestIndexes moves tasks through their lifecycle in a random order, some
// with ids older than the newest, and checks the
// indexes against a walk over every task (Get of each) after each step:
// Counts, Ended, SelectLive and List, with and without a cursor and a
// filter. All but the last 10 tasks to end are held in part.
func TestIndexes(t *testing.T) {
	a := &applier{p: New(sqlitetest.Open(t), discard()), version: map[string]int64{}}
	p := a.p
	p.keep = 10
	rng := rand.New(rand.NewPCG(17, 17))
	var made []string
	// Ids made before the others, used among them: as a clock set back,
	// or a server on another machine, would make them.
	var older []string
	for range 50 {
		older = append(older, task.NewID())
	}
	life := []eventstore.Proposed{ev(task.EventQueued), ev(task.EventStarting),
		NewEvent(task.EventStarted, task.Started{SandboxName: "sb", Handle: []byte(`{}`)}, "test"),
		NewEvent(task.EventCompleted, task.Completed{Status: task.Failed, ErrorMessage: "x", CostUSD: 0.25,
			Usage: &task.Usage{InputTokens: 3, OutputTokens: 5, CacheReadTokens: 7}}, "test")}
	for i := range 400 {
		if i%3 == 0 || len(made) == 0 {
			id := task.NewID()
			if rng.IntN(5) == 0 && len(older) > 0 {
				id, older = older[0], older[1:]
			}
			made = append(made, id)
			a.apply(id, created(task.Spec{Description: "t", Agent: []string{"claude", "codex"}[rng.IntN(2)], Origin: task.Origin{ConversationID: []string{"a", "b"}[rng.IntN(2)]}}))
			continue
		}
		if id := made[rng.IntN(len(made))]; int(a.version[id]) <= len(life) {
			a.apply(id, life[a.version[id]-1])
		}

		var all []task.Task
		counts := map[task.Status]int{}
		for id := range p.ids("") {
			tk, err := p.Get(id)
			if err != nil {
				t.Fatal(err)
			}
			all = append(all, tk)
			counts[tk.Status]++
		}
		if diff := cmp.Diff(counts, p.Counts()); diff != "" {
			t.Fatalf("step %d: Counts (-walk +index):\n%s", i, diff)
		}
		ended := newEnded()
		for _, t := range all {
			if t.Status.Terminal() {
				ended.add(&t)
			}
		}
		if diff := cmp.Diff(ended, p.Ended(), cmpopts.EquateApprox(0, 1e-9)); diff != "" { // sums in another order
			t.Fatalf("step %d: Ended (-walk +index):\n%s", i, diff)
		}
		live := p.Select(func(t *task.Task) bool { return !t.Status.Terminal() })
		if diff := cmp.Diff(ids(live), ids(p.SelectLive(func(*task.Task) bool { return true }))); diff != "" {
			t.Fatalf("step %d: SelectLive (-walk +index):\n%s", i, diff)
		}
		slices.SortFunc(all, func(a, b task.Task) int { return strings.Compare(b.ID, a.ID) })
		before := all[rng.IntN(len(all))].ID
		for _, f := range []Filter{{Limit: 7}, {Before: before, Limit: 5}, {ConversationID: "b", Limit: 3}, {Status: task.Queued}} {
			var want []string
			for _, t := range all {
				if (f.Before == "" || t.ID < f.Before) && (f.ConversationID == "" || t.ConversationID == f.ConversationID) && (f.Status == "" || t.Status == f.Status) {
					want = append(want, t.ID)
				}
			}
			wantMore := f.Limit > 0 && len(want) > f.Limit
			if wantMore {
				want = want[:f.Limit]
			}
			got, more := mustList(t, p, f)
			if diff := cmp.Diff(want, ids(got), cmpopts.EquateEmpty()); diff != "" || more != wantMore {
				t.Fatalf("step %d: List(%+v): more %v, want %v; (-walk +index):\n%s", i, f, more, wantMore, diff)
			}
		}
	}
	if p.old.len() == 0 || len(p.recent) != p.keep {
		t.Errorf("%d tasks held in part, %d ended held whole; want some and %d", p.old.len(), len(p.recent), p.keep)
	}
}

// BenchmarkEndedMemory reports the heap a server's projection keeps per
// ended task, over 20,000 tasks as a real one leaves them: a prompt of a
// sentence (or of 4 KiB, as an assistant handing over a document's worth
// of instructions writes), a local sandbox's handle (a copy of one from
// corral bench, with cgroup v1's three paths), a summary and ten output
// files. Beside it, the handle's own size.
func BenchmarkEndedMemory(b *testing.B) {
	const n = 20_000
	files := tenFiles()
	sentence := "Parse the bank statement in context/ and chart my spending by month and by category."
	for _, prompt := range []string{sentence, strings.Repeat(sentence+"\n", 4096/(len(sentence)+1))} {
		b.Run(fmt.Sprintf("prompt=%dB", len(prompt)), func(b *testing.B) {
			spec := task.Spec{Description: prompt, Agent: "claude"}
			var perTask float64
			for b.Loop() {
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				p := New(nil, discard())
				a := &applier{p: p, version: map[string]int64{}}
				for range n {
					id := task.NewID()
					for _, e := range []eventstore.Proposed{created(spec), ev(task.EventQueued), ev(task.EventStarting),
						NewEvent(task.EventStarted, task.Started{SandboxName: id, Handle: realHandle}, "test"),
						NewEvent(task.EventCompleted, task.Completed{Status: task.Success, Summary: "Spending charted: groceries and rent lead; see chart-0.png.", OutputFiles: files}, "test")} {
						a.apply(id, e)
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perTask = float64(after.HeapAlloc-before.HeapAlloc) / n
				runtime.KeepAlive(p)
			}
			b.ReportMetric(perTask, "B/ended-task")
			b.ReportMetric(float64(len(realHandle)), "B/handle")
		})
	}
}

// BenchmarkRebuild measures a server's start over a log of 20,000 ended
// tasks (the events corral bench's tasks leave, a real sandbox's handle
// among them): Rebuild, which reads the whole log and folds every task,
// per 1,000 tasks. Beside it, the same read of the log alone.
func BenchmarkRebuild(b *testing.B) {
	const n = 20_000
	ctx := context.Background()
	s := sqlitetest.Open(b)
	fillStore(b, s, n)
	var rebuild, read time.Duration
	for b.Loop() {
		start := time.Now()
		p := New(s, discard())
		if err := p.Rebuild(ctx); err != nil {
			b.Fatal(err)
		}
		rebuild += time.Since(start)
		if c := p.Counts(); c[task.Success] != n {
			b.Fatalf("rebuilt %v, want %d successes", c, n)
		}
		start = time.Now()
		events := 0
		for after := int64(0); ; {
			evs, err := s.ReadAll(ctx, after, 1024)
			if err != nil {
				b.Fatal(err)
			}
			if len(evs) == 0 {
				break
			}
			events += len(evs)
			after = evs[len(evs)-1].Position
		}
		read += time.Since(start)
		if events != 5*n {
			b.Fatalf("read %d events, want %d", events, 5*n)
		}
	}
	per1k := func(d time.Duration) float64 {
		return float64(d) / float64(b.N) / (n / 1000) / float64(time.Millisecond)
	}
	b.ReportMetric(per1k(rebuild), "rebuild-ms/1k-tasks")
	b.ReportMetric(per1k(read), "read-ms/1k-tasks")
}

// fillStore appends the events of n tasks as corral bench's leave them,
// 16 appenders at a time (they share commits), and returns their ids in
// the order they were created.
func fillStore(b *testing.B, s eventstore.Store, n int) []string {
	var wg sync.WaitGroup
	ids := make(chan string)
	for range 16 {
		wg.Go(func() {
			for id := range ids {
				evs := []eventstore.Proposed{created(task.Spec{Description: "Parse the bank statement in context/ and chart my spending by month and by category.", Agent: "claude"}),
					ev(task.EventQueued), ev(task.EventStarting),
					NewEvent(task.EventStarted, task.Started{SandboxName: id, Handle: realHandle}, "test"),
					NewEvent(task.EventCompleted, task.Completed{Status: task.Success, Summary: "Spending charted: groceries and rent lead; see chart-0.png.", OutputFiles: tenFiles()}, "test")}
				if _, err := s.Append(context.Background(), task.StreamID(id), 0, evs...); err != nil {
					b.Error(err)
				}
			}
		})
	}
	var made []string
	for range n {
		id := task.NewID()
		made = append(made, id)
		ids <- id
	}
	close(ids)
	wg.Wait()
	return made
}

// BenchmarkGetEnded measures Get of an ended task held whole (one of the
// keepEnded that ended last) and of one held in part, which Get folds
// again from its five events, over a log of 2,000 such tasks.
func BenchmarkGetEnded(b *testing.B) {
	s := sqlitetest.Open(b)
	ids := fillStore(b, s, 2*keepEnded)
	p := New(s, discard())
	if err := p.Rebuild(context.Background()); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		id   string
	}{{"whole", ids[len(ids)-1]}, {"in-part", ids[0]}} {
		b.Run(c.name, func(b *testing.B) {
			p.mu.RLock()
			old := p.old.has(c.id)
			p.mu.RUnlock()
			if old != (c.name == "in-part") {
				b.Fatalf("%s is held in part: %v", c.id, old)
			}
			for b.Loop() {
				if t, err := p.Get(c.id); err != nil || len(t.OutputFiles) != 10 {
					b.Fatal(t, err)
				}
			}
		})
	}
}

// realHandle is a local sandbox's handle as a task_started event holds it
// (a copy of one from corral bench, with cgroup v1's three paths).
var realHandle = []byte(`{"id":"task-01m8fj20fgfj8jz57wg2678a2x","runtime":"local","labels":{"corral.managed":"true","corral.task-id":"task-01m8fj20fgfj8jz57wg2678a2x"},"version":1,"state":{"id":"task-01m8fj20fgfj8jz57wg2678a2x","labels":{"corral.managed":"true","corral.task-id":"task-01m8fj20fgfj8jz57wg2678a2x"},"pid":30697,"pid_start":2117968,"cgroups":["/sys/fs/cgroup/memory/corral/warm-01m8fj203f1s3d87chq49a4m56","/sys/fs/cgroup/pids/corral/warm-01m8fj203f1s3d87chq49a4m56","/sys/fs/cgroup/cpu/corral/warm-01m8fj203f1s3d87chq49a4m56"],"owned":[{"dir":"/var/lib/corral/tasks/task-01m8fj20fgfj8jz57wg2678a2x","owner":{"UID":0,"GID":0}}],"created_at":"2026-11-27T22:29:46.229631453Z","child_pid":30699,"pid_ns":4026532185}}`)

// tenFiles are the output files of a task that charted something.
func tenFiles() []task.OutputFile {
	var files []task.OutputFile
	for i := range 10 {
		files = append(files, task.OutputFile{Name: fmt.Sprintf("chart-%d.png", i), Size: 48_213, Type: "image/png"})
	}
	return files
}

// BenchmarkArchived measures what reads of the ended tasks held in part
// pay once a checkpoint has put them in the archive's table (read in
// place, a binary search and a decode per task) against a map, over
// 100,000 ended tasks: a page of the list, a list whose filter matches
// none of them (a walk over all), Select over all, Status of one.
func BenchmarkArchived(b *testing.B) {
	const ended = 100_000
	for _, archived := range []bool{false, true} {
		p := New(nil, discard())
		fillTasks(b, p, ended, 0)
		p.store = &memStore{}
		if archived {
			if err := p.SaveCheckpoint(context.Background()); err != nil {
				b.Fatal(err)
			}
			if p.old.table.n != ended-keepEnded || len(p.old.fresh) != 0 {
				b.Fatalf("table of %d, %d fresh", p.old.table.n, len(p.old.fresh))
			}
		}
		var some string
		for id := range p.ids("") {
			if some = id; p.old.has(id) {
				break
			}
		}
		b.Run(fmt.Sprintf("archived=%v", archived), func(b *testing.B) {
			b.Run("list-first-page", func(b *testing.B) {
				for b.Loop() {
					if got, _ := mustList(b, p, Filter{Limit: 50}); len(got) != 50 {
						b.Fatal(len(got))
					}
				}
			})
			b.Run("list-matching-none", func(b *testing.B) {
				for b.Loop() {
					if got, _ := mustList(b, p, Filter{ConversationID: "none", Limit: 50}); len(got) != 0 {
						b.Fatal(len(got))
					}
				}
			})
			b.Run("select-all", func(b *testing.B) {
				for b.Loop() {
					if got := p.Select(func(*task.Task) bool { return false }); len(got) != 0 {
						b.Fatal(len(got))
					}
				}
			})
			b.Run("status", func(b *testing.B) {
				for b.Loop() {
					if st, _, ok := p.Status(some); !ok || st != task.Success {
						b.Fatal(st, ok)
					}
				}
			})
		})
	}
}
