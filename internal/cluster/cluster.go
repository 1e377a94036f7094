// Package cluster is what one Corral server knows of the others on its
// event store: which replicas are alive, and whether it is the one that
// leads.
//
// A replica is one `corral serve` process; its id is made anew at every
// start, so a restarted server is a new replica and what its predecessor
// ran is adopted like any dead replica's. A replica is alive while it
// renews its lease, a row the store keeps (eventstore/postgres: the
// replicas table, renewed every Renew, alive for TTL by the database's
// clock). Everything a replica owns — the tasks it runs — names it in
// their events, so when its lease lapses the survivors see what it left
// and adopt it (scheduler); nothing needs a lease of its own.
//
// The leader is the one replica that takes the decisions that must be
// taken once for the whole cluster: which replica starts each queued task
// (so max_concurrent_workers holds for the cluster without a lock per
// claim), webhook deliveries, the copies and reports that follow a
// task's end, retention. On PostgreSQL it is whoever holds an advisory
// lock, which the database drops with the holder's connection.
//
// On SQLite there is one server: Solo is a cluster of one, always alive,
// always leading, in which every replica recorded before this one is dead.
package cluster

import (
	"context"
	"crypto/rand"
	"strings"
	"sync"
	"time"
)

// Lease timing on a shared store: a replica renews its lease every Renew
// and is dead once TTL passed without a renewal. A survivor notices a
// dead replica within a Renew of its TTL: the failover the issue asks for
// (≤ 5 s from a kill to the first adopted task's event) has TTL + Renew +
// the adoption's own work.
const (
	TTL   = 3 * time.Second
	Renew = time.Second
)

// Replica is one server of the cluster, as its lease says.
type Replica struct {
	ID   string `json:"id"`
	Host string `json:"host"`
	// URL is where the other replicas reach its API: a session's
	// commands sent to another replica are forwarded there.
	URL string `json:"url"`
	// Runtimes are the runtimes that take work on this replica: the
	// leader gives it only tasks for one of them.
	Runtimes []string `json:"runtimes"`
	// ClockSkew is the replica's clock against the store's, as it last
	// measured it (the middle of a round trip against the database's
	// reading; 0 on Solo).
	ClockSkew time.Duration `json:"clock_skew"`
	// Started is when the replica joined.
	Started time.Time `json:"started"`
}

// NewID returns a new replica id, "r-" and ten lowercase letters or
// digits: short, as it names the replica's unix socket in the data root,
// whose path must fit a socket address (107 bytes).
func NewID() string { return "r-" + strings.ToLower(rand.Text()[:10]) }

// Members is one replica's view of the cluster.
type Members interface {
	// Self is this replica's id.
	Self() string
	// Live returns the replicas whose lease was current at the last
	// renewal, this one among them while its own is.
	Live() map[string]Replica
	// Alive returns replica id if its lease is current. One the last
	// renewal did not list (it joined since) is looked up in the store:
	// a replica is judged gone only on its lease's word, never for being
	// new. When the store cannot say, it is taken to be alive.
	Alive(id string) (Replica, bool)
	// Steady reports whether this replica has renewed its lease without a
	// gap for at least a TTL: only then may it judge another dead. A
	// replica back from a cut (its store restarted, its network gone)
	// would otherwise find every lease lapsed, its own too, and adopt
	// what live replicas run.
	Steady() bool
	// Changed returns a channel closed at the next change of Live.
	Changed() <-chan struct{}
	// Holding reports whether this replica's last renewal of its lease is
	// recent (two Renews): it reaches its store, and the others count it
	// alive. A replica that is not is not ready to serve (/healthz).
	Holding() bool
	// Lead runs fn while this replica leads, with a context that ends when
	// it stops leading, and again whenever it leads anew, until ctx ends.
	Lead(ctx context.Context, fn func(ctx context.Context))
}

// Solo is the cluster of one server alone on its store.
type Solo struct {
	self Replica
}

// NewSolo returns a cluster of one: self, alive and leading.
func NewSolo(self Replica) *Solo { return &Solo{self: self} }

// Self implements Members.
func (s *Solo) Self() string { return s.self.ID }

// Live implements Members.
func (s *Solo) Live() map[string]Replica { return map[string]Replica{s.self.ID: s.self} }

// Alive implements Members: only self is.
func (s *Solo) Alive(id string) (Replica, bool) { return s.self, id == s.self.ID }

// Steady implements Members: a server alone on its store is never cut
// from it, and every replica before it is dead.
func (s *Solo) Steady() bool { return true }

// Changed implements Members: nothing changes.
func (s *Solo) Changed() <-chan struct{} { return nil }

// Holding implements Members: a server alone holds its store while it
// runs.
func (s *Solo) Holding() bool { return true }

// Lead implements Members: fn runs until ctx ends.
func (s *Solo) Lead(ctx context.Context, fn func(ctx context.Context)) { fn(ctx) }

// View is the part of Members a lease keeper maintains: the last live set
// and the record of gaps. Implementations embed it.
type View struct {
	mu      sync.Mutex
	live    map[string]Replica
	since   time.Time // when the current run of renewals without a gap began; zero during a gap
	last    time.Time // the last renewal
	changed chan struct{}
}

// Live returns the last live set.
func (v *View) Live() map[string]Replica {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.live
}

// Changed returns a channel closed at the next change of the live set.
func (v *View) Changed() <-chan struct{} {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.changed == nil {
		v.changed = make(chan struct{})
	}
	return v.changed
}

// Steady reports whether renewals ran without a gap for a TTL up to now
// (a renewal that hangs is a gap once it is two Renews late).
func (v *View) Steady() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return !v.since.IsZero() && time.Since(v.since) >= TTL && time.Since(v.last) < 2*Renew
}

// Holding reports whether the last renewal is at most two Renews old.
func (v *View) Holding() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return time.Since(v.last) < 2*Renew
}

// Renewed records a renewal at now that found live.
func (v *View) Renewed(now time.Time, live map[string]Replica) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.since.IsZero() || now.Sub(v.last) >= 2*Renew {
		v.since = now
	}
	v.last = now
	if !sameIDs(v.live, live) && v.changed != nil {
		close(v.changed)
		v.changed = nil
	}
	v.live = live
}

// Failed records a renewal that failed, or found this replica's lease
// lapsed: a gap, after which it must be steady again before it judges.
func (v *View) Failed() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.since = time.Time{}
}

func sameIDs(a, b map[string]Replica) bool {
	if len(a) != len(b) {
		return false
	}
	for id := range a {
		if _, ok := b[id]; !ok {
			return false
		}
	}
	return true
}
