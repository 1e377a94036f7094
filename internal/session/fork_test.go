package session

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestMakeForks: forks are made at most parallel at once, each result in
// its place; once one fails, none starts after it, and those not started
// say so.
func TestMakeForks(t *testing.T) {
	for _, parallel := range []int{1, 2, 4} {
		t.Run(fmt.Sprint(parallel), func(t *testing.T) {
			var mu sync.Mutex
			running, most, calls := 0, 0, 0
			all := make(chan struct{}) // the first parallel are running
			made := makeForks(t.Context(), 12, parallel, func(context.Context) madeFork {
				mu.Lock()
				calls++
				n := calls
				running++
				most = max(most, running)
				if running == parallel && n == parallel {
					close(all)
				}
				mu.Unlock()
				if n <= parallel {
					select {
					case <-all:
					case <-time.After(5 * time.Second): // fewer ran at once
					}
				}
				time.Sleep(time.Millisecond) // room for one too many to start
				mu.Lock()
				running--
				mu.Unlock()
				return madeFork{token: fmt.Sprint(n)}
			})
			if most != parallel {
				t.Errorf("%d forks ran at once, want %d", most, parallel)
			}
			seen := map[string]bool{}
			for i, f := range made {
				if f.err != nil || f.token == "" || seen[f.token] {
					t.Errorf("fork %d: %+v", i, f)
				}
				seen[f.token] = true
			}
		})
	}
	t.Run("a failure stops the rest", func(t *testing.T) {
		boom := errors.New("boom")
		var mu sync.Mutex
		calls := 0
		failing := make(chan struct{})
		made := makeForks(t.Context(), 12, 3, func(context.Context) madeFork {
			mu.Lock()
			calls++
			n := calls
			mu.Unlock()
			if n == 2 {
				close(failing)
				return madeFork{err: boom}
			}
			// Each other fork takes a while once the failure is there:
			// nine of them, three at a time, would take 60 ms at least.
			<-failing
			time.Sleep(20 * time.Millisecond)
			return madeFork{token: "ok"}
		})
		var failed, notStarted, ok int
		for i, f := range made {
			switch {
			case errors.Is(f.err, boom):
				failed++
			case errors.Is(f.err, errNotStarted):
				notStarted++
			case f.err == nil && f.token == "ok":
				ok++
			default:
				t.Errorf("fork %d: %+v", i, f)
			}
		}
		if failed != 1 || notStarted == 0 || notStarted != 12-calls || ok != calls-1 {
			t.Errorf("%d made, %d failed, %d not started, %d called; want one failed, the rest of those called made, and those not called not started", ok, failed, notStarted, calls)
		}
	})
}
