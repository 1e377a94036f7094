//go:build integration

package e2e_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/webhook"
)

// TestProgressFloodIsBoundedPerTask runs a task that has its own key (the
// test gives it, as if a worker's had got out: the agent cannot read it),
// and posts signed progress reports with fresh ids as
// fast as the server answers for a few seconds (testdata/progressflood),
// while another task runs. What the flood stores is bounded by the task's
// progress budget, and the other task's completion webhook gets through.
func TestProgressFloodIsBoundedPerTask(t *testing.T) {
	const floodFor = 5 * time.Second
	s := MustStart(t, nil)
	mustBuildStatic(t, "./testdata/progressflood", filepath.Join(s.data, "shared", "bin", "progressflood"))
	before := dbBytes(t, s.data)

	flood := s.spawn(t, "flood progress", "/workspace/shared/bin/progressflood", floodFor.String())
	secret, err := os.ReadFile(filepath.Join(s.data, "run", "webhook.key"))
	if err != nil {
		t.Fatal(err)
	}
	key := flood.ID + " " + hex.EncodeToString(webhook.DeriveKey(secret, flood.ID))
	if err := os.WriteFile(filepath.Join(s.data, "tasks", flood.ID, "flood-key"), []byte(key), 0o644); err != nil {
		t.Fatal(err)
	}
	s.waitStatus(t, flood.ID, task.Running, 30*time.Second)
	honest := s.spawn(t, "an honest task", "sh", "-c", "sleep 1; echo done > output/done.txt")
	s.waitSuccess(t, honest.ID, 60*time.Second)
	if got := completedBy(t, s, honest.ID); got != "webhook" {
		t.Errorf("the honest task ended by %q, want by its completion webhook", got)
	}
	s.waitSuccess(t, flood.ID, 60*time.Second)

	b, err := os.ReadFile(filepath.Join(s.data, "tasks", flood.ID, "output", "flood.json"))
	if err != nil {
		t.Fatalf("the flood wrote no report: %v", err)
	}
	var rep struct {
		Accepted, Limited, Other int
		FirstError               string `json:"first_error"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	t.Logf("flood: %d reports accepted, %d answered 429, %d other (%s)", rep.Accepted, rep.Limited, rep.Other, rep.FirstError)
	if rep.Accepted == 0 || rep.Limited < 10*rep.Accepted {
		t.Errorf("the flood had %d reports accepted and %d refused: it did not flood, or was not limited", rep.Accepted, rep.Limited)
	}

	// The budget: a burst of 64 items and 10 a second, and one note per
	// 10 s, over the flood and a second of slack.
	items, notes := 0, 0
	err = s.client.Events(context.Background(), service.EventsRequest{TaskID: flood.ID}, func(e eventstore.Event) error {
		if e.Type != task.EventProgress {
			return nil
		}
		items++
		var p task.Progress
		if err := json.Unmarshal(e.Data, &p); err != nil {
			return err
		}
		if p.Kind == webhook.KindProgressDropped {
			notes++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	grew := dbBytes(t, s.data) - before
	t.Logf("the flood recorded %d progress events, %d of them notes; corral.db grew by %d bytes", items, notes, grew)
	secs := int(floodFor/time.Second) + 1
	if most := 64 + 10*secs + secs/10 + 1; items > most {
		t.Errorf("the flood recorded %d progress events, more than the budget's %d", items, most)
	}
	if notes == 0 {
		t.Errorf("no %s note among the flood's %d progress events", webhook.KindProgressDropped, items)
	}
	// Unbounded, the flood grew corral.db by 13-17 MB a second.
	if grew > 4<<20 {
		t.Errorf("corral.db grew by %d bytes during the flood, more than 4 MiB", grew)
	}
}

// dbBytes is the size of the event store's files.
func dbBytes(t *testing.T, data string) int64 {
	t.Helper()
	var n int64
	for _, f := range []string{"corral.db", "corral.db-wal"} {
		if fi, err := os.Stat(filepath.Join(data, f)); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// completedBy returns the reason of a task's worker_completed event.
func completedBy(t *testing.T, s *server, id string) string {
	t.Helper()
	reason := ""
	err := s.client.Events(context.Background(), service.EventsRequest{TaskID: id}, func(e eventstore.Event) error {
		if e.Type == task.EventCompleted {
			var c task.Completed
			if err := json.Unmarshal(e.Data, &c); err != nil {
				return err
			}
			reason = c.Reason
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return reason
}
