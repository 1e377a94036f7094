package projection

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/task"
)

// applier applies events straight to a projection without a store, or,
// when its projection has one, appends them there and catches up.
type applier struct {
	p       *Tasks
	pos     int64
	version map[string]int64
}

func (a *applier) apply(id string, e eventstore.Proposed) {
	if a.p.store != nil {
		got, err := a.p.store.Append(context.Background(), task.StreamID(id), a.version[id], e)
		if err != nil {
			panic(err)
		}
		a.version[id]++
		if err := a.p.CatchUp(context.Background(), got[0].Position); err != nil {
			panic(err)
		}
		return
	}
	a.pos++
	a.version[id]++
	a.p.apply(eventstore.Event{ID: fmt.Sprint(a.pos), StreamID: task.StreamID(id), StreamVersion: a.version[id],
		Type: e.Type, Data: e.Data, RecordedAt: time.Now(), Position: a.pos})
}

// queued makes n queued tasks and returns their ids.
func (a *applier) queued(n int) []string {
	var ids []string
	for range n {
		id := task.NewID()
		a.apply(id, created(task.Spec{Description: "wait"}))
		a.apply(id, ev(task.EventQueued))
		ids = append(ids, id)
	}
	return ids
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestTaskChanged: a task's channel closes at its own events only, and an
// ended or unknown task has none, leaving nothing behind.
func TestTaskChanged(t *testing.T) {
	a := &applier{p: New(nil, discard()), version: map[string]int64{}}
	p := a.p
	if ch := p.TaskChanged(task.NewID()); ch != nil {
		t.Error("an unknown task has a channel to wait on")
	}
	ids := a.queued(2)
	ch, other := p.TaskChanged(ids[0]), p.TaskChanged(ids[1])
	if ch == nil || closed(ch) || p.TaskChanged(ids[0]) != ch {
		t.Fatal("a live task's channel is nil, closed, or not the same for two waiters")
	}
	a.apply(ids[1], ev(task.EventProgress))
	if closed(ch) || !closed(other) {
		t.Fatalf("after an event of the other task: own closed %v, other's closed %v; want false, true", closed(ch), closed(other))
	}
	a.apply(ids[0], ev(task.EventProgress))
	if !closed(ch) {
		t.Fatal("the task's channel is open after its event")
	}
	ch = p.TaskChanged(ids[0])
	a.apply(ids[0], NewEvent(task.EventCompleted, task.Completed{Status: task.Cancelled}, "test"))
	if !closed(ch) {
		t.Fatal("the task's channel is open after its end")
	}
	if ch := p.TaskChanged(ids[0]); ch != nil {
		t.Error("an ended task has a channel to wait on")
	}
	if n := len(p.waits); n != 0 {
		t.Errorf("%d channels left with no waiter on them", n)
	}
}

// BenchmarkWaiters: 500 goroutines each wait, as a long poll or a task's
// supervisor does, for their own task to end, while events (progress) come
// for one task after another. Per event, the CPU time of this process
// (cpu-ns/event): waiting with TaskChanged beside waiting with Changed,
// which woke every waiter on every event.
func BenchmarkWaiters(b *testing.B) {
	for _, how := range []string{"changed", "task-changed"} {
		b.Run(how, func(b *testing.B) {
			a := &applier{p: New(nil, discard()), version: map[string]int64{}}
			p := a.p
			ids := a.queued(500)
			var wg sync.WaitGroup
			for _, id := range ids {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						ch := p.Changed()
						if how == "task-changed" {
							ch = p.TaskChanged(id)
						}
						if t, err := p.Get(id); err != nil || t.Status.Terminal() {
							return
						}
						<-ch
					}
				}()
			}
			cpu0 := cpuNanos()
			for i := 0; b.Loop(); i++ {
				a.apply(ids[i%len(ids)], ev(task.EventProgress))
			}
			for _, id := range ids {
				a.apply(id, NewEvent(task.EventCompleted, task.Completed{Status: task.Cancelled}, "test"))
			}
			wg.Wait()
			b.ReportMetric(float64(cpuNanos()-cpu0)/float64(b.N), "cpu-ns/event")
		})
	}
}

// cpuNanos is this process's user and system CPU time.
func cpuNanos() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}
