package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/eventstore/sqlite/sqlitetest"
	"github.com/corral-dev/corral/internal/placement"
	"github.com/corral-dev/corral/internal/rtkind"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
	"github.com/corral-dev/corral/internal/workspace"
)

// The reaper leaves a session a suspend, resume, fork or delete holds
// (its lifecycle lock) and ends it once the operation is over: ending it
// meanwhile raced the operation (a resume recorded after the end made an
// ended session run again, its egress closed and its workspace released;
// its checkpoint was removed under its restore).
func TestReaperLeavesSessionsAnOperationHolds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	data, err := workspace.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const old, idle, full = "sess-01m8jbh60d7qh1g11cxcbgpmzh", "sess-01m8jbh60d7qh1g11cxcbgpmzj", "sess-01m8jbh60d7qh1g11cxcbgpmzk"
	m := New(Options{Store: sqlitetest.Open(t), Data: data, IdleAction: IdleDelete, Quota: overQuota(full)}, slog.New(slog.DiscardHandler))
	long := time.Now().Add(-time.Hour)
	// old is suspended past its lifetime, idle runs past its idle time,
	// full over its disk quota.
	for _, s := range []Session{
		{ID: old, Status: StatusRunning, CreatedAt: long, LastUsedAt: time.Now(), IdleTimeout: 3600, MaxLifetime: 60},
		{ID: idle, Status: StatusRunning, CreatedAt: time.Now(), LastUsedAt: long, IdleTimeout: 60, MaxLifetime: 3600},
		{ID: full, Status: StatusRunning, CreatedAt: time.Now(), LastUsedAt: time.Now(), IdleTimeout: 3600, MaxLifetime: 3600},
	} {
		recordSession(t, m, s)
	}
	if err := m.append(ctx, old, EventSuspended, suspended{MemoryKept: true}); err != nil {
		t.Fatal(err)
	}
	unlocks := []func(){m.lockOps(old), m.lockOps(idle), m.lockOps(full)}
	reaped := make(chan error, 1)
	go func() { reaped <- m.Reap(ctx) }()
	time.Sleep(2500 * time.Millisecond) // two of the reaper's rounds
	for _, id := range []string{old, idle, full} {
		if s, _ := m.get(id); s.Status == StatusEnded {
			t.Errorf("session %s was ended (%s) while an operation held it", id, s.EndReason)
		}
	}
	for _, unlock := range unlocks {
		unlock()
	}
	want := map[string]string{old: "max_lifetime", idle: "idle_timeout", full: "disk_quota"}
	deadline := time.Now().Add(10 * time.Second)
	for id, reason := range want {
		for {
			s, _ := m.get(id)
			if s.Status == StatusEnded {
				if s.EndReason != reason {
					t.Errorf("session %s ended with %q, want %q", id, s.EndReason, reason)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("session %s not ended once free: %s", id, s.Status)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	cancel()
	if err := <-reaped; err != nil {
		t.Fatal(err)
	}
}

// recordSession records session s as made by m's replica, with tokens of
// its own that the test does not need.
func recordSession(t *testing.T, m *Manager, s Session) {
	t.Helper()
	if err := m.append(context.Background(), s.ID, EventCreated, created{Session: s, TokenHash: hashToken(newToken()), AgentTokenHash: hashToken(newToken()), Replica: m.opts.Members.Self()}); err != nil {
		t.Fatal(err)
	}
}

// overQuota is a Quota whose check fails for session id only.
type overQuota string

func (overQuota) Limit(context.Context, string, string) error { return nil }
func (q overQuota) Check(_ context.Context, id, _ string) (time.Duration, error) {
	if id == string(q) {
		return 0, errors.New("over its quota")
	}
	return time.Hour, nil
}
func (overQuota) Release(context.Context, string, string) {}

// A session's end is final in the fold: a resume or suspend recorded
// after it (a server before the reaper kept to the lock could write
// one) leaves it ended, so its sandbox is destroyed at the next start
// rather than served with its egress closed and its workspace released.
func TestEndIsFinalInTheFold(t *testing.T) {
	ctx := context.Background()
	store := sqlitetest.Open(t)
	m := New(Options{Store: store}, slog.New(slog.DiscardHandler))
	const id = "sess-01m8jbh60d7qh1g11cxcbgpmzh"
	recordSession(t, m, Session{ID: id, Status: StatusRunning})
	for _, e := range []struct {
		typ     string
		payload any
	}{
		{EventSuspended, suspended{MemoryKept: true}},
		{EventEnded, map[string]string{"reason": "max_lifetime"}},
		{EventResumed, resumed{AgentTokenHash: hashToken(newToken()), Replica: m.opts.Members.Self()}},
		{EventSuspended, suspended{}},
	} {
		if err := m.append(ctx, id, e.typ, e.payload); err != nil {
			t.Fatal(err)
		}
	}
	// As folded by this server, and by the next one from the log.
	again := New(Options{Store: store}, slog.New(slog.DiscardHandler))
	if err := again.sync(ctx); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*Manager{m, again} {
		if s, err := m.get(id); err != nil || s.Status != StatusEnded || s.EndReason != "max_lifetime" {
			t.Errorf("after an end, a resume and a suspend: %+v, %v; want ended (max_lifetime)", s.Status, err)
		}
	}
}

// TestDiscardedCheckpointsRemoved: a restored checkpoint is moved aside
// at once and removed by the reaper's next round; one a server killed
// before its removal left behind is removed by the next server's Start.
// The checkpoint of a suspended session is left alone.
func TestDiscardedCheckpointsRemoved(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	data, err := workspace.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	const resumed, killed, suspendedID = "sess-01m8jbh60d7qh1g11cxcbgpmzm", "sess-01m8jbh60d7qh1g11cxcbgpmzn", "sess-01m8jbh60d7qh1g11cxcbgpmzp"
	m := New(Options{Store: sqlitetest.Open(t), Data: data}, slog.New(slog.DiscardHandler))
	image := func(id, name string) string {
		dir := filepath.Join(filepath.Dir(m.checkpointDir(id)), name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "pages.img"), []byte("pages"), 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	left := image(killed, checkpointName+discardedSuffix+"x1")
	kept := image(suspendedID, checkpointName)
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Errorf("a checkpoint moved aside by the server before: %v after Start, want removed", err)
	}
	restored := image(resumed, checkpointName)
	m.discardCheckpoint(resumed)
	if _, err := os.Stat(restored); !os.IsNotExist(err) {
		t.Errorf("the restored checkpoint: %v after its discard, want moved aside", err)
	}
	go m.Reap(ctx)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		aside, _ := filepath.Glob(restored + discardedSuffix + "*")
		if len(aside) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the restored checkpoint moved aside is still there 10 s later: %v", aside)
		}
	}
	if _, err := os.Stat(filepath.Join(kept, "pages.img")); err != nil {
		t.Errorf("a suspended session's checkpoint: %v, want kept", err)
	}
}

// The reaper ends, lost, a running session whose sandbox has ended (or is
// gone from its runtime), saying so, when the sandbox is one this replica
// sees: its own session's, or, alone on its store, a session of a replica
// gone. In a cluster the session of a replica gone is left to endOrphans,
// which waits for its exec agent to dial in: its sandbox may run on
// another machine.
func TestReaperEndsSessionsWhoseSandboxEnded(t *testing.T) {
	const own, ownGone, ownRuns, gone = "sess-01m8jbh60d7qh1g11cxcbgpm00", "sess-01m8jbh60d7qh1g11cxcbgpm01", "sess-01m8jbh60d7qh1g11cxcbgpm02", "sess-01m8jbh60d7qh1g11cxcbgpm03"
	for _, tt := range []struct {
		name    string
		members cluster.Members
		want    map[string]string
	}{
		{"alone", cluster.NewSolo(cluster.Replica{ID: "r-self"}), map[string]string{own: StatusEnded, ownGone: StatusEnded, ownRuns: StatusRunning, gone: StatusEnded}},
		{"in a cluster", twoReplicas{Solo: cluster.NewSolo(cluster.Replica{ID: "r-self"}), other: "r-other"}, map[string]string{own: StatusEnded, ownGone: StatusEnded, ownRuns: StatusRunning, gone: StatusRunning}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			fake := sandboxtest.NewFake()
			fake.Run = func(ctx context.Context, _ sandbox.Spec) sandbox.ExitStatus {
				<-ctx.Done()
				return sandbox.ExitStatus{Code: 137, Message: "killed by SIGKILL"}
			}
			m := stopAllManager(t, fake, tt.members)
			for id, replica := range map[string]string{own: "r-self", ownGone: "r-self", ownRuns: "r-self", gone: "r-gone"} {
				if id != ownGone {
					if _, err := fake.Create(ctx, sandbox.Spec{ID: id}); err != nil {
						t.Fatal(err)
					}
				}
				// Neither idle nor past its lifetime.
				c := created{Session: Session{ID: id, Status: StatusRunning, Runtime: rtkind.Local, CreatedAt: time.Now(), LastUsedAt: time.Now(), IdleTimeout: 3600, MaxLifetime: 3600}, TokenHash: hashToken(newToken()), AgentTokenHash: hashToken(newToken()), Replica: replica}
				if err := m.append(ctx, id, EventCreated, c); err != nil {
					t.Fatal(err)
				}
			}
			for _, id := range []string{own, gone} {
				fake.Stop(ctx, id, time.Second) // ended from outside
			}
			reaped := make(chan error, 1)
			go func() { reaped <- m.Reap(ctx) }()
			// The ended first: the round that ends them looked at the others.
			deadline := time.Now().Add(10 * time.Second)
			for id, status := range tt.want {
				for status == StatusEnded {
					s, _ := m.get(id)
					if s.Status == StatusEnded {
						if s.EndReason != "lost" || !strings.Contains(s.EndError, "sandbox") {
							t.Errorf("session %s ended %q (%q), want lost saying its sandbox ended", id, s.EndReason, s.EndError)
						}
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("session %s is %s, want ended", id, s.Status)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			time.Sleep(1500 * time.Millisecond) // a round after: the first has looked at every session
			for id, status := range tt.want {
				if s, _ := m.get(id); s.Status != status {
					t.Errorf("session %s is %s, want %s", id, s.Status, status)
				}
			}
			cancel()
			if err := <-reaped; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// An ended session's sandbox whose destroy failed is destroyed again by
// the reaper, each wait twice the last, until one succeeds; one
// quarantined is left to an operator.
func TestReaperDestroysAgain(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const held, quarantined = "sess-01m8jbh60d7qh1g11cxcbgpmza", "sess-01m8jbh60d7qh1g11cxcbgpmzb"
	fake := sandboxtest.NewFake()
	fake.Run = func(ctx context.Context, _ sandbox.Spec) sandbox.ExitStatus {
		<-ctx.Done()
		return sandbox.ExitStatus{Code: 143}
	}
	var mu sync.Mutex
	tries := map[string]int{}
	fake.DestroyErr = func(id string) error {
		mu.Lock()
		defer mu.Unlock()
		tries[id]++
		switch {
		case id == quarantined:
			return fmt.Errorf("give back: %w", sandbox.ErrQuarantined)
		case tries[id] <= 2:
			return errors.New("cgroup busy")
		}
		return nil
	}
	local, _ := rtkind.Of(rtkind.Local)
	data, err := workspace.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	m := New(Options{
		Store:        sqlitetest.Open(t),
		Data:         data,
		Placements:   placement.NewSet(&placement.Runtime{Kind: local, Sandbox: fake}),
		DestroyRetry: 10 * time.Millisecond,
	}, slog.New(slog.DiscardHandler))
	for _, id := range []string{held, quarantined} {
		if _, err := fake.Create(ctx, sandbox.Spec{ID: id}); err != nil {
			t.Fatal(err)
		}
		recordRunning(t, m, id, m.opts.Members.Self())
		m.end(ctx, id, "deleted")
		if s, _ := m.get(id); s.Status != StatusEnded {
			t.Fatalf("session %s: %s after its end", id, s.Status)
		}
	}
	if len(fake.Destroyed()) != 0 {
		t.Fatalf("destroyed %v at once, want none", fake.Destroyed())
	}
	reaped := make(chan error, 1)
	go func() { reaped <- m.Reap(ctx) }()
	deadline := time.Now().Add(15 * time.Second)
	for !slices.Contains(fake.Destroyed(), held) {
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox whose destroy failed was not destroyed again: %v", tries)
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(1500 * time.Millisecond) // another round of the reaper's
	cancel()
	if err := <-reaped; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if tries[held] != 3 || tries[quarantined] != 1 {
		t.Errorf("destroys %v, want 3 of %s (2 failed) and 1 of the quarantined %s", tries, held, quarantined)
	}
	fake.DestroyErr = nil
	fake.Destroy(context.Background(), quarantined)
}
