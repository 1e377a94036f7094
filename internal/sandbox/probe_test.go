package sandbox_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/corral-dev/corral/internal/sandbox"
)

func TestProbedKeepsAProbeThatRanToItsEnd(t *testing.T) {
	var p sandbox.Probed
	var n atomic.Int32
	probe := func(ctx context.Context) sandbox.Capabilities {
		n.Add(1)
		return sandbox.Capabilities{Available: true, Version: "v1"}
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if c := p.Get(context.Background(), probe); !c.Available || c.Version != "v1" {
				t.Errorf("Get = %+v", c)
			}
		})
	}
	wg.Wait()
	if n.Load() != 1 {
		t.Fatalf("%d probes for 8 calls, want 1", n.Load())
	}
}

// A probe whose caller gave up answers that caller, and the next call
// probes again: a cut probe's "cannot be reached" is not the runtime's.
func TestProbedForgetsAProbeCutShort(t *testing.T) {
	var p sandbox.Probed
	ctx, cancel := context.WithCancel(context.Background())
	cut := p.Get(ctx, func(context.Context) sandbox.Capabilities {
		cancel()
		return sandbox.Capabilities{Reason: "the engine cannot be reached: context canceled"}
	})
	if cut.Available {
		t.Fatalf("the cut probe's answer: %+v", cut)
	}
	calls := 0
	for range 2 {
		c := p.Get(context.Background(), func(context.Context) sandbox.Capabilities {
			calls++
			return sandbox.Capabilities{Available: true}
		})
		if !c.Available {
			t.Fatalf("after a cut probe: %+v, want the new probe's answer", c)
		}
	}
	if calls != 1 {
		t.Fatalf("%d probes after the cut one, want 1 (then kept)", calls)
	}
}
