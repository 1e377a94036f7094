package sandbox

import (
	"context"
	"sync"
)

// Probed keeps a runtime's Capabilities, probed once: the first probe
// that runs to its end is kept and answered from then on. One whose
// context ended first (a request that timed out, a server stopping) is
// answered but not kept, so the next call probes again: a probe cut
// short says "cannot be reached", which would otherwise hold until the
// server restarts. Callers wait for a probe under way.
type Probed struct {
	mu   sync.Mutex
	kept bool
	caps Capabilities
}

// Get answers the kept Capabilities, or probes for them.
func (p *Probed) Get(ctx context.Context, probe func(context.Context) Capabilities) Capabilities {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.kept {
		return p.caps
	}
	caps := probe(ctx)
	if ctx.Err() == nil {
		p.kept, p.caps = true, caps
	}
	return caps
}
