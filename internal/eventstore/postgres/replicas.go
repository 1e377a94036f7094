package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/corral-dev/corral/internal/cluster"
)

// Members is a replica's membership of the cluster of servers sharing a
// database (cluster.Members): its lease, renewed in the replicas table,
// the live set read back with each renewal, and the leader's advisory
// lock.
type Members struct {
	cluster.View
	s    *Store
	self cluster.Replica
	key  int64 // the leader's advisory lock
}

var _ cluster.Members = (*Members)(nil)

// Join makes self a live replica of the database's cluster, with a first
// renewal of its lease before it returns, and renews it every
// cluster.Renew until the store closes. Close then removes the lease, so
// the others adopt what this replica leaves at once rather than after a
// TTL.
func (s *Store) Join(ctx context.Context, self cluster.Replica) (*Members, error) {
	var oid uint32
	if err := s.pool.QueryRow(ctx, "SELECT 'events'::regclass::oid").Scan(&oid); err != nil {
		return nil, fmt.Errorf("event store (%s): find the events table: %w", s.target, classify(err))
	}
	m := &Members{s: s, self: self, key: leaderKey(oid)}
	var skew time.Duration
	if err := m.renew(ctx, &skew); err != nil {
		return nil, fmt.Errorf("event store (%s): join the cluster: %w", s.target, err)
	}
	bgctx, stop := context.WithCancel(context.Background())
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		defer stop()
		t := time.NewTicker(cluster.Renew)
		defer t.Stop()
		failing := false
		for {
			select {
			case <-s.quit:
				// Gone cleanly: the others need not wait out the lease.
				ctx, cancel := context.WithTimeout(bgctx, 5*time.Second)
				if _, err := s.pool.Exec(ctx, "DELETE FROM replicas WHERE id = $1", self.ID); err != nil {
					s.log.Warn("cannot end this replica's lease; the others adopt what it leaves once it lapses", "err", err)
				}
				cancel()
				return
			case <-t.C:
			}
			ctx, cancel := context.WithTimeout(bgctx, cluster.TTL)
			err := m.renew(ctx, &skew)
			cancel()
			switch {
			case err != nil && !failing:
				s.log.Error("cannot renew this replica's lease; the others adopt its tasks if it lapses", "replica", self.ID, "err", err)
			case err == nil && failing:
				s.log.Info("this replica's lease is renewed again", "replica", self.ID)
			}
			failing = err != nil
		}
	}()
	return m, nil
}

// leaderKey is the leader's advisory lock for the events table with oid:
// "corr" in its high half, so that two clusters in two schemas of one
// database each have a leader.
func leaderKey(oid uint32) int64 { return 0x636f7272<<32 | int64(oid) }

// renew renews the lease (made if missing: at the first renewal, or after
// a lapse another replica's cleanup removed) and reads the live set, in
// one round trip; skew carries the clock skew from one renewal to the
// next.
func (m *Members) renew(ctx context.Context, skew *time.Duration) error {
	ttl := cluster.TTL.Seconds()
	runtimes := m.self.Runtimes
	if runtimes == nil {
		runtimes = []string{} // a nil slice is SQL's NULL
	}
	b := &pgx.Batch{}
	b.Queue(`INSERT INTO replicas (id, host, url, runtimes, clock_skew_ms, started_at, renewed_at)
		VALUES ($1, $2, $3, $4, $5, now(), now())
		ON CONFLICT (id) DO UPDATE SET renewed_at = now(), clock_skew_ms = $5`,
		m.self.ID, m.self.Host, m.self.URL, runtimes, skew.Milliseconds())
	b.Queue(`DELETE FROM replicas WHERE renewed_at < now() - interval '1 hour'`)
	b.Queue(`SELECT id, host, url, runtimes, clock_skew_ms, started_at, clock_timestamp() FROM replicas
		WHERE renewed_at > now() - make_interval(secs => $1) ORDER BY id`, ttl)
	before := time.Now()
	res := m.s.pool.SendBatch(ctx, b)
	defer res.Close()
	if _, err := res.Exec(); err != nil {
		m.Failed()
		return classify(err)
	}
	if _, err := res.Exec(); err != nil {
		m.Failed()
		return classify(err)
	}
	rows, err := res.Query()
	if err != nil {
		m.Failed()
		return classify(err)
	}
	live := map[string]cluster.Replica{}
	var dbNow time.Time
	for rows.Next() {
		var r cluster.Replica
		var ms int64
		if err := rows.Scan(&r.ID, &r.Host, &r.URL, &r.Runtimes, &ms, &r.Started, &dbNow); err != nil {
			rows.Close()
			m.Failed()
			return classify(err)
		}
		r.ClockSkew = time.Duration(ms) * time.Millisecond
		live[r.ID] = r
	}
	if err := rows.Err(); err != nil {
		m.Failed()
		return classify(err)
	}
	now := time.Now()
	if !dbNow.IsZero() {
		// This machine's clock against the database's, at the middle of
		// the round trip: the next renewal records it.
		*skew = now.Add(-now.Sub(before) / 2).Sub(dbNow)
	}
	if _, ok := live[m.self.ID]; !ok {
		m.Failed() // cannot be: the insert above is in the same batch
		return fmt.Errorf("this replica's lease is not among the live ones")
	}
	m.Renewed(now, live)
	return nil
}

// Self implements cluster.Members.
func (m *Members) Self() string { return m.self.ID }

// Alive implements cluster.Members.
func (m *Members) Alive(id string) (cluster.Replica, bool) {
	if r, ok := m.Live()[id]; ok {
		return r, true
	}
	if id == "" {
		return cluster.Replica{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), cluster.Renew)
	defer cancel()
	r := cluster.Replica{ID: id}
	var ms int64
	err := m.s.pool.QueryRow(ctx, `SELECT host, url, runtimes, clock_skew_ms, started_at FROM replicas
		WHERE id = $1 AND renewed_at > now() - make_interval(secs => $2)`, id, cluster.TTL.Seconds()).
		Scan(&r.Host, &r.URL, &r.Runtimes, &ms, &r.Started)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return cluster.Replica{}, false
	case err != nil:
		return r, true // cannot tell: not gone
	}
	r.ClockSkew = time.Duration(ms) * time.Millisecond
	return r, true
}

// Lead implements cluster.Members: the leader is whoever holds the
// advisory lock, taken on a connection of its own and checked every
// cluster.Renew. The database drops the lock with the connection, so a
// leader killed, or cut from the database, gives way within moments; one
// whose connection fails stops leading (fn's context ends) at the next
// check. Two leaders overlap only while a cut leader has not noticed yet
// (a Renew at most): what the leader does is safe to do twice (a task's
// start is claimed under its stream's version; a delivery sent twice has
// one webhook-id).
func (m *Members) Lead(ctx context.Context, fn func(ctx context.Context)) {
	for ctx.Err() == nil {
		conn, ok := m.tryLead(ctx)
		if !ok {
			select {
			case <-ctx.Done():
			case <-time.After(cluster.Renew):
			}
			continue
		}
		m.s.log.Info("this replica leads the cluster", "replica", m.self.ID)
		lctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			t := time.NewTicker(cluster.Renew)
			defer t.Stop()
			for {
				select {
				case <-lctx.Done():
					return
				case <-t.C:
				}
				pctx, pcancel := context.WithTimeout(lctx, cluster.Renew)
				err := conn.Ping(pctx)
				pcancel()
				if err != nil && lctx.Err() == nil {
					m.s.log.Error("lost the leader's lock (its connection failed); another replica leads", "replica", m.self.ID, "err", err)
					cancel()
					return
				}
			}
		}()
		fn(lctx)
		cancel()
		<-done
		closeConn(conn) // gives the lock back
	}
}

// tryLead takes the leader's lock, if no one holds it, on a new
// connection that then holds it.
func (m *Members) tryLead(ctx context.Context) (*pgx.Conn, bool) {
	conn, err := pgx.ConnectConfig(ctx, m.s.connCfg.Copy())
	if err != nil {
		return nil, false
	}
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", m.key).Scan(&ok); err != nil || !ok {
		closeConn(conn)
		return nil, false
	}
	return conn, true
}
