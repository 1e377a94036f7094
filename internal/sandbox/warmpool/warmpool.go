// Package warmpool is the part of a runtime's warm sandboxes
// (sandbox.Warmer) that does not depend on the runtime: one pool per
// shape, filled ahead of need and refilled in the background after every
// claim, emptied after an idle time and when the policy ends, held to the
// policy's budget, with the counts WarmStats reports. The runtime starts
// and destroys the sandboxes (Runtime) and hands a claimed one to its task.
//
// A box is taken out of its pool before it is handed over (Take), so no
// two tasks ever get the same one; one given back unused (Release) was
// never handed over.
package warmpool

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/sandbox"
)

// Runtime starts and destroys a runtime's warm sandboxes, B.
type Runtime[B any] interface {
	// StartWarm starts a sandbox of shape that waits for its task.
	StartWarm(ctx context.Context, shape sandbox.WarmShape) (B, error)
	// DestroyWarm destroys a warm sandbox that no task has.
	DestroyWarm(ctx context.Context, b B) error
}

// Pools are one runtime's pools, one per shape of the policy Keep runs.
type Pools[B any] struct {
	name string // the runtime's, in WarmStats
	rt   Runtime[B]
	log  *slog.Logger

	mu     sync.Mutex
	pools  []*Pool[B]
	budget *budget
}

// New returns a runtime's Pools, empty until Keep runs.
func New[B any](name string, rt Runtime[B], log *slog.Logger) *Pools[B] {
	return &Pools[B]{name: name, rt: rt, log: log}
}

// Keep keeps p.Size sandboxes of each shape warm, within p's budget, until
// ctx ends, then destroys those not claimed and returns. The runtime has
// checked the shapes.
func (ps *Pools[B]) Keep(ctx context.Context, p sandbox.WarmPolicy) error {
	if p.Size <= 0 || len(p.Shapes) == 0 {
		return nil
	}
	bud := &budget{max: p.MaxSandboxes, maxMem: p.MaxMemory}
	var pools []*Pool[B]
	for _, sh := range p.Shapes {
		pl := &Pool[B]{ps: ps, shape: sh, size: p.Size, idle: p.Idle, target: p.Size, kick: make(chan struct{}, 1), lastUse: time.Now(), budget: bud, pressure: p.Pressure}
		pl.stats = sandbox.WarmStats{Runtime: ps.name, Shape: sh.Name}
		pools = append(pools, pl)
	}
	ps.mu.Lock()
	if ps.pools != nil {
		ps.mu.Unlock()
		return errors.New("keep sandboxes warm: already keeping them")
	}
	ps.pools, ps.budget = pools, bud
	ps.mu.Unlock()
	var wg sync.WaitGroup
	for _, pl := range pools {
		wg.Go(func() { pl.run(ctx) })
	}
	wg.Wait()
	ps.mu.Lock()
	ps.pools, ps.budget = nil, nil
	ps.mu.Unlock()
	return nil
}

// Stats reports each pool (sandbox.Warmer's WarmStats).
func (ps *Pools[B]) Stats() []sandbox.WarmStats {
	ps.mu.Lock()
	pools := slices.Clone(ps.pools)
	ps.mu.Unlock()
	var out []sandbox.WarmStats
	for _, pl := range pools {
		pl.mu.Lock()
		st := pl.stats
		st.Ready, st.Target = len(pl.ready), pl.target
		pl.mu.Unlock()
		out = append(out, st)
	}
	return out
}

// Take takes a warm sandbox for spec out of the pool whose shape it fits:
// ok is false for a spec no shape fits, or when that pool has none ready
// (a miss, which has the pool fill). After a take the caller hands the box
// over, or gives it back (Release) or destroys it (Destroy), then wakes
// the pool (Wake): the next box's start, much of it this process's own
// work, does not compete with the claim.
func (ps *Pools[B]) Take(spec sandbox.Spec) (_ *Pool[B], b B, ok bool) {
	ps.mu.Lock()
	pools := ps.pools
	ps.mu.Unlock()
	for _, pl := range pools {
		if pl.shape.Fits(spec) {
			b, ok = pl.take()
			return pl, b, ok
		}
	}
	return nil, b, false
}

// Pool keeps one shape's warm sandboxes.
type Pool[B any] struct {
	ps       *Pools[B]
	shape    sandbox.WarmShape
	size     int
	idle     time.Duration
	kick     chan struct{} // wakes run: a claim, a miss
	budget   *budget
	pressure func() bool // sandbox.WarmPolicy.Pressure

	mu      sync.Mutex
	ready   []B
	target  int
	lastUse time.Time
	stats   sandbox.WarmStats
	stopped bool // run has returned: nothing goes back into ready
}

// mem is what one of the pool's sandboxes counts for in the budget: its
// memory limit, the most it may take once claimed.
func (p *Pool[B]) mem() int64 { return p.shape.Template.Limits.MemoryBytes }

// pressed reports whether the host is short of memory.
func (p *Pool[B]) pressed() bool { return p.pressure != nil && p.pressure() }

// Shape is the pool's shape.
func (p *Pool[B]) Shape() sandbox.WarmShape { return p.shape }

// take takes a ready box, or counts a miss and wakes the pool to fill.
func (p *Pool[B]) take() (b B, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// A miss is a use too: the pool fills again and waits its idle time.
	p.lastUse = time.Now()
	if len(p.ready) == 0 {
		p.stats.Misses++
		p.target = p.size
		p.Wake()
		return b, false
	}
	b = p.ready[0]
	p.ready = p.ready[1:]
	p.stats.Claims++
	p.budget.release(1, p.mem())
	return b, true
}

// Release gives back a box taken and never handed over: a spec whose
// sandbox turned out to exist already. The box is destroyed if the pool
// has stopped, or if the budget has no room for it any more.
func (p *Pool[B]) Release(b B) {
	p.mu.Lock()
	keep := !p.stopped && p.budget.reserve(p.mem())
	if keep {
		p.ready = append([]B{b}, p.ready...)
		p.stats.Claims--
	}
	p.mu.Unlock()
	if !keep {
		p.Destroy(context.Background(), b)
	}
}

// Destroy destroys a box taken from the pool and never handed over, and
// counts it.
func (p *Pool[B]) Destroy(ctx context.Context, b B) {
	if err := p.ps.rt.DestroyWarm(ctx, b); err != nil {
		p.ps.log.Warn("cannot destroy a warm sandbox", "shape", p.shape.Name, logkey.Error, err)
		return
	}
	p.mu.Lock()
	p.stats.Destroyed++
	p.mu.Unlock()
}

// Wake has the pool fill.
func (p *Pool[B]) Wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// run fills the pool to its target whenever it is kicked, shrinks it
// after an idle time or while pressure says the host is short of memory,
// and empties it when ctx ends.
func (p *Pool[B]) run(ctx context.Context) {
	tick := p.idle / 4
	if p.pressure != nil && (tick == 0 || tick > time.Second) {
		tick = time.Second
	}
	var ticks <-chan time.Time
	if tick > 0 {
		t := time.NewTicker(max(tick, 10*time.Millisecond))
		defer t.Stop()
		ticks = t.C
	}
	failures := 0
	for {
		if n := p.fill(ctx); n < 0 {
			// A start failed: try again later, not in a loop.
			failures++
			select {
			case <-ctx.Done():
			case <-time.After(min(time.Second<<min(failures, 6), time.Minute)):
			}
		} else {
			failures = 0
		}
		select {
		case <-ctx.Done():
			p.mu.Lock()
			p.stopped = true
			p.mu.Unlock()
			p.empty(context.WithoutCancel(ctx))
			return
		case <-p.kick:
		case <-ticks:
			p.mu.Lock()
			idle := p.idle > 0 && p.target > 0 && time.Since(p.lastUse) >= p.idle
			if idle {
				p.target = 0
			}
			p.mu.Unlock()
			if idle {
				p.ps.log.Info("warm pool idle: emptied until the next task of its shape", "shape", p.shape.Name, "idle", p.idle)
				p.empty(ctx)
			}
			// Under pressure the warm sandboxes go first, before the
			// tasks' own memory does; the pool fills again at its next
			// claim or miss once the pressure is gone.
			if p.pressed() {
				p.mu.Lock()
				p.target = 0
				p.mu.Unlock()
				if p.empty(ctx) > 0 {
					p.ps.log.Warn("host short of memory: warm pool emptied", "shape", p.shape.Name)
				}
			}
		}
	}
}

// startLimit bounds a warm sandbox's start.
const startLimit = 30 * time.Second

// fill starts warm sandboxes until the pool holds its target, as far as
// the budget allows. It returns how many it started, or -1 if a start
// failed.
func (p *Pool[B]) fill(ctx context.Context) int {
	n := 0
	for ctx.Err() == nil {
		p.mu.Lock()
		need := len(p.ready) < p.target
		p.mu.Unlock()
		if !need || p.pressed() || !p.budget.reserve(p.mem()) {
			return n
		}
		// A start goes on when ctx ends (the server stopping), for at
		// most startLimit, and its sandbox is then destroyed: one cut
		// short can leave what nothing clears (runsc's record of a
		// container whose launcher went on starting it).
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), startLimit)
		b, err := p.ps.rt.StartWarm(sctx, p.shape)
		cancel()
		p.mu.Lock()
		if err != nil {
			p.stats.Failed++
			p.mu.Unlock()
			p.budget.release(1, p.mem())
			if ctx.Err() == nil {
				p.ps.log.Warn("cannot start a warm sandbox", "shape", p.shape.Name, logkey.Error, err)
			}
			return -1
		}
		p.stats.Started++
		keep := len(p.ready) < p.target && ctx.Err() == nil
		if keep {
			p.ready = append(p.ready, b)
		}
		p.mu.Unlock()
		if !keep {
			p.budget.release(1, p.mem())
			p.Destroy(context.WithoutCancel(ctx), b)
		}
		n++
	}
	return n
}

// empty destroys every ready sandbox of the pool, eight at a time, and
// returns how many. A destroy waits for its sandbox's end: a pod's, on a
// cluster, 4 to 8 s under gVisor on a busy node, which one after the
// other held a server's stop for as long again per pod.
func (p *Pool[B]) empty(ctx context.Context) int {
	p.mu.Lock()
	boxes := p.ready
	p.ready = nil
	p.mu.Unlock()
	p.budget.release(len(boxes), p.mem())
	var g errgroup.Group
	g.SetLimit(8)
	for _, b := range boxes {
		g.Go(func() error { p.Destroy(ctx, b); return nil })
	}
	g.Wait()
	return len(boxes)
}

// budget bounds a runtime's warm sandboxes, those ready and those being
// started, across its pools: at most max of them (0: no bound), holding
// at most maxMem bytes of memory limits (0: no bound).
type budget struct {
	max    int
	maxMem int64

	mu  sync.Mutex
	n   int
	mem int64
}

// reserve counts one more sandbox of memory limit mem, if the budget has
// room for it.
func (b *budget) reserve(mem int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if (b.max > 0 && b.n+1 > b.max) || (b.maxMem > 0 && b.mem+mem > b.maxMem) {
		return false
	}
	b.n++
	b.mem += mem
	return true
}

// release counts n sandboxes of memory limit mem fewer.
func (b *budget) release(n int, mem int64) {
	b.mu.Lock()
	b.n -= n
	b.mem -= int64(n) * mem
	b.mu.Unlock()
}
