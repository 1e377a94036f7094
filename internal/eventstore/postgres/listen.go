package postgres

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// connectListener opens the listening connection: one of its own, outside
// the pool, as it spends its life waiting for notifications.
func (s *Store) connectListener(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, s.connCfg.Copy())
	if err != nil {
		return nil, fmt.Errorf("connect to listen: %w", classify(err))
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		closeConn(conn)
		return nil, fmt.Errorf("listen: %w", classify(err))
	}
	return conn, nil
}

// listen runs until ctx ends, moving the head to each notification's and
// reconnecting when the connection is lost, after which it re-reads the
// head: what committed meanwhile was notified to nobody.
func (s *Store) listen(ctx context.Context, conn *pgx.Conn) {
	defer s.bg.Done()
	lost := false
	for {
		if conn == nil {
			c, err := s.connectListener(ctx)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				if !lost {
					s.logError(slog.LevelWarn, "event store cannot listen for appends; retrying", err)
					lost = true
				}
				select {
				case <-time.After(recheckEvery):
				case <-ctx.Done():
					return
				}
				continue
			}
			conn, lost = c, false
			s.log.Info("event store listening for appends again", "target", s.target)
			s.refresh(ctx)
		}
		n, err := conn.WaitForNotification(ctx)
		if ctx.Err() != nil {
			closeConn(conn)
			return
		}
		if err != nil {
			s.logError(slog.LevelWarn, "event store lost its listening connection; reconnecting", classify(err))
			lost = true
			closeConn(conn)
			conn = nil
			continue
		}
		head, err := strconv.ParseInt(n.Payload, 10, 64)
		if err != nil {
			// Not an append of this store's (a NOTIFY by hand?): the head
			// from the database instead.
			s.refresh(ctx)
			continue
		}
		s.advance(head)
	}
}

// recheck re-reads the head every interval while anyone waits, in case a
// notification was lost.
func (s *Store) recheck(ctx context.Context, interval time.Duration) {
	defer s.bg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
		if s.waiting.Load() > 0 {
			s.refresh(ctx)
		}
	}
}

// refresh moves the head to the database's.
func (s *Store) refresh(ctx context.Context) {
	qctx, cancel := context.WithTimeout(ctx, queryTimeout)
	defer cancel()
	var head int64
	if err := s.pool.QueryRow(qctx, "SELECT position FROM event_head").Scan(&head); err != nil {
		if ctx.Err() == nil {
			s.logError(slog.LevelDebug, "read the event store's head", classify(err))
		}
		return
	}
	s.advance(head)
}

// closeConn closes conn, waiting a moment at most for the server to hear
// of it.
func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx) // nothing to do about a connection that does not close cleanly
}
