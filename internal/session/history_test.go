package session

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/sqlite/sqlitetest"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// A session's history comes in pages of the latest events, each page's
// cursor leading to the one before: read back to the start they hold every
// lifecycle event once, in order, and none of the stream's other events
// (tokens granted), however long the session has run.
func TestHistoryPages(t *testing.T) {
	ctx := context.Background()
	store := sqlitetest.Open(t)
	m := New(Options{Store: store}, slog.New(slog.DiscardHandler))
	const id = "sess-01m8jbh60d7qh1g11cxcbgpmzh"
	recordSession(t, m, Session{ID: id, Status: StatusRunning})
	const commands = 450
	var batch []eventstore.Proposed
	add := func(typ string, v any) {
		b, _ := json.Marshal(v)
		batch = append(batch, eventstore.Proposed{Type: typ, SchemaVersion: task.SchemaVersion, Data: b})
	}
	for i := range commands {
		add(EventExecStart, map[string]any{"exec_id": fmt.Sprintf("exec-%d", i), "command": fmt.Sprintf("echo %d", i)})
		if i%50 == 0 {
			add(EventGranted, map[string]any{"task_id": fmt.Sprintf("task-%d", i)})
		}
		add(EventExecEnd, map[string]any{"exec_id": fmt.Sprintf("exec-%d", i), "exit_code": 0})
	}
	if _, err := store.Append(ctx, StreamID(id), eventstore.AnyVersion, batch...); err != nil {
		t.Fatal(err)
	}

	first, err := m.History(ctx, service.SessionHistoryRequest{ID: id})
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Events) != service.SessionHistoryLimit || first.Before == 0 {
		t.Fatalf("first page: %d events, before %d; want %d and a cursor", len(first.Events), first.Before, service.SessionHistoryLimit)
	}
	if last := first.Events[len(first.Events)-1]; last.Type != EventExecEnd || last.Detail["exec_id"] != fmt.Sprintf("exec-%d", commands-1) {
		t.Errorf("first page ends with %s %v, want the last command's end", last.Type, last.Detail)
	}

	// Back to the start, 150 at a time.
	var all []service.SessionEvent
	req := service.SessionHistoryRequest{ID: id, Limit: 150}
	for pages := 0; ; pages++ {
		if pages > 2*commands {
			t.Fatal("the cursors never reach the start")
		}
		page, err := m.History(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		all = append(page.Events, all...)
		if page.Before == 0 {
			break
		}
		req.Before = page.Before
	}
	if want := 1 + 2*commands; len(all) != want {
		t.Fatalf("%d events over all pages, want %d", len(all), want)
	}
	if all[0].Type != EventCreated {
		t.Errorf("the history starts with %s, want %s", all[0].Type, EventCreated)
	}
	for i := 1; i < len(all); i++ {
		if all[i].Seq <= all[i-1].Seq {
			t.Fatalf("event %d (seq %d) after seq %d: not in order, or twice", i, all[i].Seq, all[i-1].Seq)
		}
		if all[i].Type == EventGranted {
			t.Fatalf("event %d is a token grant: not history", i)
		}
		if want := fmt.Sprintf("exec-%d", (i-1)/2); all[i].Detail["exec_id"] != want {
			t.Fatalf("event %d is %s of %v, want %s", i, all[i].Type, all[i].Detail["exec_id"], want)
		}
	}

	for _, bad := range []service.SessionHistoryRequest{{ID: id, Limit: service.SessionHistoryMaxLimit + 1}, {ID: id, Limit: -1}, {ID: id, Before: -3}} {
		if _, err := m.History(ctx, bad); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("History(limit %d, before %d) = %v, want an invalid argument", bad.Limit, bad.Before, err)
		}
	}
}
