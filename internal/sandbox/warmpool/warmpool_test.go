package warmpool

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/sandbox"
)

// counter is a Runtime whose sandboxes are numbers: it counts those
// started and not destroyed. The runtimes' own tests start real ones.
type counter struct {
	mu        sync.Mutex
	next      int
	live      map[int]bool
	destroyed []int
}

func (c *counter) StartWarm(ctx context.Context, _ sandbox.WarmShape) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next++
	c.live[c.next] = true
	return c.next, nil
}

func (c *counter) DestroyWarm(ctx context.Context, b int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.live, b)
	c.destroyed = append(c.destroyed, b)
	return nil
}

func (c *counter) nLive() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.live)
}

func shape(name string, n sandbox.Network, mem int64) sandbox.WarmShape {
	return sandbox.WarmShape{Name: name, Template: sandbox.Spec{Network: n, Limits: sandbox.Limits{MemoryBytes: mem}}}
}

// keep runs ps.Keep(p) until the test ends.
func keep(t *testing.T, ps *Pools[int], p sandbox.WarmPolicy) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- ps.Keep(ctx, p) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Keep: %v", err)
		}
	})
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10 s for %s", what)
		}
	}
}

// gated is a counter whose StartWarm waits for gate, and records whether
// its context had ended by then.
type gated struct {
	counter
	started chan struct{}
	gate    chan struct{}
	cut     atomic.Bool
}

func (g *gated) StartWarm(ctx context.Context, sh sandbox.WarmShape) (int, error) {
	g.started <- struct{}{}
	<-g.gate
	if ctx.Err() != nil {
		g.cut.Store(true)
	}
	return g.counter.StartWarm(ctx, sh)
}

// TestStopMidStart: the pools stop while a warm sandbox starts. The start
// goes on under a context the stop does not end (one cut short can leave
// what nothing clears: runsc's record of its container), and the sandbox
// is destroyed once started: none outlives Keep.
func TestStopMidStart(t *testing.T) {
	g := &gated{counter: counter{live: map[int]bool{}}, started: make(chan struct{}, 8), gate: make(chan struct{})}
	ps := New[int]("test", g, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- ps.Keep(ctx, sandbox.WarmPolicy{Size: 1, Shapes: []sandbox.WarmShape{shape("a", sandbox.NetworkNone, 0)}})
	}()
	<-g.started
	cancel()
	close(g.gate)
	if err := <-done; err != nil {
		t.Fatalf("Keep: %v", err)
	}
	if g.cut.Load() {
		t.Errorf("the start's context ended with the pools'")
	}
	if n := g.nLive(); n != 0 {
		t.Errorf("%d warm sandboxes outlive Keep, want 0", n)
	}
}

// TestBudget: the pools of a runtime together hold no more sandboxes, and
// no more memory limits, than the budget, whatever each pool's size; a
// claim frees room for its pool to refill; a sandbox is taken once.
func TestBudget(t *testing.T) {
	for _, tt := range []struct {
		name string
		p    sandbox.WarmPolicy
		want int
	}{
		{"count", sandbox.WarmPolicy{Size: 4, MaxSandboxes: 3}, 3},
		{"memory", sandbox.WarmPolicy{Size: 4, MaxMemory: 5 << 20}, 5}, // 1 MiB each
		{"none", sandbox.WarmPolicy{Size: 4}, 8},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := &counter{live: map[int]bool{}}
			ps := New[int]("test", c, slog.New(slog.DiscardHandler))
			tt.p.Shapes = []sandbox.WarmShape{shape("a", sandbox.NetworkNone, 1<<20), shape("b", sandbox.NetworkEgress, 1<<20)}
			keep(t, ps, tt.p)
			ready := func() int {
				n := 0
				for _, st := range ps.Stats() {
					n += st.Ready
				}
				return n
			}
			waitFor(t, "the pools to fill", func() bool { return ready() == tt.want })
			time.Sleep(50 * time.Millisecond) // time to overfill, if they would
			if n := c.nLive(); n != tt.want {
				t.Fatalf("%d warm sandboxes, want %d", n, tt.want)
			}
			seen := map[int]bool{}
			for i := range tt.want + 2 {
				pl, b, ok := ps.Take(tt.p.Shapes[i%2].Template)
				if !ok {
					continue
				}
				if seen[b] {
					t.Fatalf("sandbox %d taken twice", b)
				}
				seen[b] = true
				pl.Wake()
			}
			if len(seen) == 0 {
				t.Fatal("no sandbox taken")
			}
			// Taken ones are the takers': the pools refill within budget.
			waitFor(t, "the pools to refill", func() bool { return ready() == tt.want })
			time.Sleep(50 * time.Millisecond)
			if n := c.nLive() - len(seen); n != tt.want {
				t.Errorf("%d warm sandboxes ready after the claims, want %d", n, tt.want)
			}
		})
	}
}

// TestPressure: while the host is short of memory the pools destroy their
// sandboxes, and they fill again at a claim once it is not.
func TestPressure(t *testing.T) {
	c := &counter{live: map[int]bool{}}
	ps := New[int]("test", c, slog.New(slog.DiscardHandler))
	var short atomic.Bool
	sh := shape("a", sandbox.NetworkNone, 0)
	keep(t, ps, sandbox.WarmPolicy{Size: 2, Shapes: []sandbox.WarmShape{sh}, Pressure: short.Load})
	waitFor(t, "the pool to fill", func() bool { return c.nLive() == 2 })
	short.Store(true)
	waitFor(t, "the pool to empty under pressure", func() bool { return c.nLive() == 0 })
	short.Store(false)
	if _, _, ok := ps.Take(sh.Template); ok {
		t.Fatal("a sandbox taken from a pool emptied under pressure")
	}
	waitFor(t, "the pool to fill after the miss", func() bool { return c.nLive() == 2 })
	if st := ps.Stats()[0]; st.Misses != 1 || st.Destroyed != 2 {
		t.Errorf("stats %+v, want 1 miss, 2 destroyed", st)
	}
}

// slowDestroy is a counter whose DestroyWarm waits until four destroys
// are under way at once (or a second has passed), and records the most
// that were.
type slowDestroy struct {
	counter
	mu       sync.Mutex
	now, max int
	four     chan struct{}
}

func (s *slowDestroy) DestroyWarm(ctx context.Context, b int) error {
	s.mu.Lock()
	s.now++
	s.max = max(s.max, s.now)
	if s.now == 4 {
		close(s.four)
	}
	s.mu.Unlock()
	select {
	case <-s.four:
	case <-time.After(time.Second):
	}
	s.mu.Lock()
	s.now--
	s.mu.Unlock()
	return s.counter.DestroyWarm(ctx, b)
}

// TestStopDestroysTogether: a pool's stop destroys its ready sandboxes
// at the same time, not one after the other (a destroy waits for its
// sandbox's end: seconds for a pod).
func TestStopDestroysTogether(t *testing.T) {
	s := &slowDestroy{counter: counter{live: map[int]bool{}}, four: make(chan struct{})}
	ps := New[int]("test", s, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- ps.Keep(ctx, sandbox.WarmPolicy{Size: 4, Shapes: []sandbox.WarmShape{shape("a", sandbox.NetworkNone, 0)}})
	}()
	waitFor(t, "the pool to fill", func() bool { st := ps.Stats(); return len(st) == 1 && st[0].Ready == 4 })
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Keep: %v", err)
	}
	if n := s.nLive(); n != 0 {
		t.Errorf("%d warm sandboxes outlive Keep, want 0", n)
	}
	if s.max != 4 {
		t.Errorf("at most %d destroys at once, want the 4 ready sandboxes' together", s.max)
	}
}
