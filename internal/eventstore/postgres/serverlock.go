package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/corral-dev/corral/internal/errdefs"
)

// serverLockKey is the advisory lock a Corral server holds on its
// database while it uses it ("corral" in ASCII).
const serverLockKey int64 = 0x636f7272616c

// LockServer takes the database's server lock, on a connection of its own
// held until Close: one Corral server at a time uses a database, until
// several can share its queue, its running tasks and its deliveries. A
// second server's LockServer fails with errdefs.ErrFailedPrecondition,
// saying so. The lock lives as long as its connection: a server that
// loses it (the database restarted) is told in the log, and a second
// server could then start beside it.
func (s *Store) LockServer(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, s.connCfg.Copy())
	if err != nil {
		return fmt.Errorf("event store (%s): connect for the server lock: %w", s.target, classify(err))
	}
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", serverLockKey).Scan(&ok); err != nil {
		closeConn(conn)
		return fmt.Errorf("event store (%s): take the server lock: %w", s.target, classify(err))
	}
	if !ok {
		closeConn(conn)
		return fmt.Errorf("event store (%s): another Corral server uses this database; several servers on one database are not supported yet, so stop the other first: %w",
			s.target, errdefs.ErrFailedPrecondition)
	}
	s.mu.Lock()
	s.lockConn = conn
	s.mu.Unlock()
	s.bg.Add(1)
	go s.watchLock(conn)
	return nil
}

// lockCheckEvery is how often the server lock's connection is checked.
const lockCheckEvery = 10 * time.Second

// watchLock checks the server lock's connection now and then and logs its
// loss once; it closes the connection with Close.
func (s *Store) watchLock(conn *pgx.Conn) {
	defer s.bg.Done()
	defer closeConn(conn)
	t := time.NewTicker(lockCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-s.quit:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
		err := conn.Ping(ctx)
		cancel()
		if err != nil {
			s.log.Error("lost the event store's server lock (its connection failed): another server could now use this database beside this one; restart this server",
				"target", s.target, "err", err)
			return
		}
	}
}
