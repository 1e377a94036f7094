package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
)

var _ eventstore.Checkpoints = (*Store)(nil)

// SaveCheckpoint implements eventstore.Checkpoints. It writes on the
// writer's one connection, in a transaction of its own: between two
// batches of appends, which wait for it in database/sql's queue for that
// connection. On a second connection they would wait for SQLite's write
// lock in the busy handler's sleeps instead (1, 2, 5, ... up to 100 ms
// each), well past the end of the write. A checkpoint of 100,000 ended
// tasks (some 5 MB) holds them for tens of milliseconds.
func (s *Store) SaveCheckpoint(ctx context.Context, name string, position int64, data []byte) (err error) {
	if err := eventstore.CheckCheckpoint(name, position); err != nil {
		return err
	}
	if s.isClosed() {
		return fmt.Errorf("save checkpoint %s: %w", name, ErrClosed)
	}
	if data == nil {
		data = []byte{} // NOT NULL: an empty checkpoint is a checkpoint
	}
	tx, err := s.wdb.BeginTx(ctx, nil) // BEGIN IMMEDIATE, as for appends
	if err != nil {
		return fmt.Errorf("save checkpoint %s: begin: %w", name, err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback() // the error that made us roll back is the one to report
		}
	}()
	// >= and not >: see eventstore.Checkpoints.
	if _, err := tx.ExecContext(ctx, `INSERT INTO checkpoints (name, position, data, saved_at) VALUES (?, ?, ?, ?)
		ON CONFLICT (name) DO UPDATE SET position = excluded.position, data = excluded.data, saved_at = excluded.saved_at
		WHERE excluded.position >= checkpoints.position`,
		name, position, data, time.Now().UTC().Format(timeFormat)); err != nil {
		return fmt.Errorf("save checkpoint %s: %w", name, classify(err))
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("save checkpoint %s: commit: %w", name, classify(err))
	}
	return nil
}

// LoadCheckpoint implements eventstore.Checkpoints.
func (s *Store) LoadCheckpoint(ctx context.Context, name string) (int64, []byte, bool, error) {
	var (
		pos  int64
		data []byte // database/sql copies it out of the driver's buffer
	)
	err := s.rdb.QueryRowContext(ctx, "SELECT position, data FROM checkpoints WHERE name = ?", name).Scan(&pos, &data)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil, false, nil
	}
	if err != nil {
		return 0, nil, false, fmt.Errorf("load checkpoint %s: %w", name, err)
	}
	return pos, data, true, nil
}
