package session

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/eventstore/sqlite/sqlitetest"
	"github.com/corral-dev/corral/internal/execagent/execagenttest"
	"github.com/corral-dev/corral/internal/workspace"
)

// A restored agent dials in at its SIGCONT, before its resume is
// recorded: it is held until the record and attached then (not refused
// to dial again, which cost a resume 10 to 80 ms), never before it; and
// refused if the resume fails.
func TestAgentHeldWhileItsResumeIsRecorded(t *testing.T) {
	ctx := context.Background()
	data, err := workspace.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m := New(Options{Store: sqlitetest.Open(t), Data: data}, slog.New(slog.DiscardHandler))
	const id = "sess-01m8jbh60d7qh1g11cxcbgpmzh"
	agentHash := hashToken(newToken())
	if err := m.append(ctx, id, EventCreated, created{Session: Session{ID: id, Status: StatusRunning}, TokenHash: hashToken(newToken()), AgentTokenHash: agentHash}); err != nil {
		t.Fatal(err)
	}
	if err := m.append(ctx, id, EventSuspended, suspended{MemoryKept: true}); err != nil {
		t.Fatal(err)
	}
	// dial has the agent dial in during a resume (as Resume marks it)
	// and says when AttachAgent answers.
	dial := func() (chan struct{}, chan error) {
		resuming := make(chan struct{})
		m.mu.Lock()
		m.held[id] = resuming
		m.mu.Unlock()
		conn, br := execagenttest.Dial(t, []string{"PATH=/usr/bin:/bin"})
		answer := make(chan error, 1)
		go func() { answer <- m.AttachAgent(ctx, id, true, upgraded(conn, br)) }()
		select {
		case err := <-answer:
			t.Fatalf("the agent was answered before its resume was recorded: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
		return resuming, answer
	}

	resuming, answer := dial()
	close(resuming) // the resume failed: nothing recorded
	if err := <-answer; err == nil {
		t.Error("the agent of a resume that failed was attached")
	}

	resuming, answer = dial()
	if err := m.append(ctx, id, EventResumed, resumed{AgentTokenHash: agentHash, Replica: m.opts.Members.Self(), MemoryKept: true}); err != nil {
		t.Fatal(err)
	}
	close(resuming)
	select {
	case err := <-answer:
		if err != nil {
			t.Fatalf("the agent was refused once its resume was recorded: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the agent was not answered once its resume was recorded")
	}
	if m.agent(id) == nil {
		t.Error("the agent is not attached after its resume's record")
	}
}
