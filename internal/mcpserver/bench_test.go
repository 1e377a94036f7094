package mcpserver

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// BenchmarkWaitReturn measures how long after a task's terminal event a
// waiting read_task_result returns to an MCP client: the real orchestrator
// over a SQLite store (synchronous=FULL), the MCP server and the SDK client
// over the in-memory transport. Each iteration spawns a task, starts a
// read_task_result with wait_seconds, lets it wait, appends worker_completed
// and times the answer. Run: go test -run '^$' -bench WaitReturn
// -benchtime 100x ./internal/mcpserver — the median over 100 tasks is the
// figure in docs/benchmarks.md.
//
// after_commit_ms counts from the moment the append (commit and
// projection) returned; after_append_ms from just before the append, so it
// includes the SQLite commit and fsync.
func BenchmarkWaitReturn(b *testing.B) {
	f := MustFixture(b)
	cs, _ := MustConnect(b, f.svc, nil)
	ctx := context.Background()
	var fromCommit, fromAppend []float64
	for b.Loop() {
		tk, _, err := f.orch.Spawn(ctx, service.SpawnRequest{TaskDescription: "bench", Agent: "command", Command: []string{"true"}})
		if err != nil {
			b.Fatal(err)
		}
		returned := make(chan time.Time, 1)
		go func() {
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "read_task_result", Arguments: map[string]any{"task_id": tk.ID, "wait_seconds": 30}})
			if err != nil || res.IsError {
				b.Errorf("read_task_result: %v %v", err, res)
			}
			returned <- time.Now()
		}()
		time.Sleep(5 * time.Millisecond) // the call is waiting by now (a round trip is ~0.1 ms)
		before := time.Now()
		if _, err := f.tasks.Update(ctx, tk.ID, func(task.Task) ([]eventstore.Proposed, error) {
			return []eventstore.Proposed{projection.NewEvent(task.EventCompleted, task.Completed{Status: task.Cancelled, Reason: "bench"}, "bench")}, nil
		}); err != nil {
			b.Fatal(err)
		}
		after := time.Now()
		end := <-returned
		fromAppend = append(fromAppend, float64(end.Sub(before))/1e6)
		fromCommit = append(fromCommit, max(0, float64(end.Sub(after))/1e6))
	}
	b.ReportMetric(median(fromCommit), "after_commit_ms")
	b.ReportMetric(median(fromAppend), "after_append_ms")
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
