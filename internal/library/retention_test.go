package library

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// MustQueued records a task that has not ended, with its directory.
func (f *fixture) MustQueued(tb testing.TB) task.Task {
	tb.Helper()
	id := task.NewID()
	dir, err := f.data.CreateTask(id)
	if err != nil {
		tb.Fatal(err)
	}
	dir.Close()
	ev := func(typ string, payload any) eventstore.Proposed { return projection.NewEvent(typ, payload, "test") }
	t, err := f.tasks.Create(context.Background(), id, ev(task.EventCreated, task.Created{Spec: task.Spec{Description: "d", Agent: task.AgentCommand}}), ev(task.EventQueued, nil))
	if err != nil {
		tb.Fatal(err)
	}
	return t
}

// types returns the types of a task's events, in order.
func (f *fixture) types(tb testing.TB, id string) []string {
	tb.Helper()
	var out []string
	for _, e := range f.events(tb, id) {
		out = append(out, e.Type)
	}
	return out
}

// A removal that fails is an event, and the next sweep retries it.
func TestFailedRemovalIsRecordedAndRetried(t *testing.T) {
	clk := &testClock{t: time.Now()}
	f := MustNew(t, func(o *Options) {
		o.Now = clk.Now
		o.Retention = Retention{TaskDirs: time.Hour}
	})
	ctx := context.Background()
	tk := f.MustEnd(t, false, nil)
	pending := f.MustQueued(t)
	stuck := filepath.Join(f.data.TaskPath(tk.ID), "output", "stuck.txt")
	os.WriteFile(stuck, []byte("x"), 0o644)
	if err := exec.Command("chattr", "+i", stuck).Run(); err != nil {
		t.Skipf("cannot make a file immutable here (needs root and a filesystem with chattr): %v", err)
	}
	t.Cleanup(func() { exec.Command("chattr", "-i", stuck).Run() })

	clk.Advance(2 * time.Hour)
	rep, err := f.lib.GC(ctx, service.GCRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Failed) != 1 || rep.Failed[0].ID != tk.ID || len(rep.TaskDirectories) != 0 {
		t.Fatalf("report %+v, want the one removal failed", rep)
	}
	if types := f.types(t, tk.ID); types[len(types)-1] != task.EventRemovalFailed {
		t.Errorf("events %v, want removal_failed last", types)
	}

	exec.Command("chattr", "-i", stuck).Run()
	rep, err = f.lib.GC(ctx, service.GCRequest{})
	if err != nil || len(rep.TaskDirectories) != 1 || len(rep.Failed) != 0 {
		t.Fatalf("retry: %+v %v, want the directory removed", rep, err)
	}
	if _, err := os.Stat(f.data.TaskPath(tk.ID)); !os.IsNotExist(err) {
		t.Errorf("directory still there: %v", err)
	}
	if types := f.types(t, tk.ID); types[len(types)-1] != task.EventDirectoryRemoved {
		t.Errorf("events %v, want task_directory_removed last", types)
	}
	if _, err := os.Stat(f.data.TaskPath(pending.ID)); err != nil {
		t.Errorf("a task that has not ended lost its directory: %v", err)
	}
}

// RunRetention sweeps at start and on its interval until its context ends.
func TestRunRetentionSweepsOnItsInterval(t *testing.T) {
	clk := &testClock{t: time.Now()}
	f := MustNew(t, func(o *Options) {
		o.Now = clk.Now
		o.Retention = Retention{TaskDirs: time.Hour, Interval: 20 * time.Millisecond}
	})
	tk := f.MustEnd(t, false, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.lib.RunRetention(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("RunRetention: %v", err)
		}
	}()
	time.Sleep(50 * time.Millisecond)
	if _, err := os.Stat(f.data.TaskPath(tk.ID)); err != nil {
		t.Fatalf("removed before its retention: %v", err)
	}
	clk.Advance(2 * time.Hour)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(f.data.TaskPath(tk.ID)); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sweeper never removed the old directory")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
