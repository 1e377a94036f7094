package session

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"

	"github.com/corral-dev/corral/internal/eventstore/sqlite"
)

// A token granted to a task reaches its session while the task runs and
// dies with the task: one the task left in a file (an output saved to
// shared/, say) reaches nothing afterwards, here and after a restart that
// folds the session's stream again. The session's own token lives on.
func TestGrantedTokenDiesWithItsTask(t *testing.T) {
	ctx := context.Background()
	store, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "corral.db"), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var mu sync.Mutex
	ended := map[string]bool{}
	opts := Options{Store: store, TaskEnded: func(id string) bool {
		mu.Lock()
		defer mu.Unlock()
		e, known := ended[id]
		return !known || e
	}}
	m := New(opts, slog.New(slog.DiscardHandler))
	own := newToken()
	const id = "sess-01m8jbh60d7qh1g11cxcbgpmzh"
	if err := m.append(ctx, id, EventCreated, created{Session: Session{ID: id, Status: StatusRunning}, TokenHash: hashToken(own), AgentTokenHash: hashToken(newToken())}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	ended["task-a"], ended["task-b"] = false, false
	mu.Unlock()
	a, err := m.Grant(ctx, id, "task-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Grant(ctx, id, "task-b")
	if err != nil {
		t.Fatal(err)
	}
	if !m.Authorize(id, a) || !m.Authorize(id, b) || !m.Authorize(id, own) {
		t.Fatalf("tokens of running tasks and the session's own refused")
	}
	mu.Lock()
	ended["task-a"] = true
	mu.Unlock()
	if m.Authorize(id, a) {
		t.Errorf("the token of an ended task reaches its session")
	}
	if !m.Authorize(id, b) || !m.Authorize(id, own) {
		t.Errorf("another task's token, or the session's own, refused after one task ended")
	}
	// A restart folds the stream again: the same answers.
	again := New(opts, slog.New(slog.DiscardHandler))
	evs, err := store.ReadStream(ctx, StreamID(id), 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		again.apply(e)
	}
	if again.Authorize(id, a) || !again.Authorize(id, b) || !again.Authorize(id, own) {
		t.Errorf("after a restart: ended task's token %v, running task's %v, session's own %v; want false, true, true",
			again.Authorize(id, a), again.Authorize(id, b), again.Authorize(id, own))
	}
	// A task the server does not know (its events gone) grants nothing.
	mu.Lock()
	delete(ended, "task-b")
	mu.Unlock()
	if m.Authorize(id, b) {
		t.Errorf("the token of an unknown task reaches its session")
	}
}
