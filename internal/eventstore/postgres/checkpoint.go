package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/corral-dev/corral/internal/eventstore"
)

var _ eventstore.Checkpoints = (*Store)(nil)

// SaveCheckpoint implements eventstore.Checkpoints with one upsert, which
// takes the row's lock: of several servers saving one name at once, each
// compares its position with the row the one before it left, so the row
// never goes back. It takes no lock an append takes.
func (s *Store) SaveCheckpoint(ctx context.Context, name string, position int64, data []byte) error {
	if err := eventstore.CheckCheckpoint(name, position); err != nil {
		return err
	}
	if s.isClosed() {
		return fmt.Errorf("save checkpoint %s: %w", name, ErrClosed)
	}
	if data == nil {
		data = []byte{} // NOT NULL: an empty checkpoint is a checkpoint
	}
	// >= and not >: see eventstore.Checkpoints.
	if _, err := s.pool.Exec(ctx, `INSERT INTO checkpoints (name, position, data) VALUES ($1, $2, $3)
		ON CONFLICT (name) DO UPDATE SET position = excluded.position, data = excluded.data, saved_at = now()
		WHERE excluded.position >= checkpoints.position`, name, position, data); err != nil {
		return fmt.Errorf("save checkpoint %s: %w", name, classify(err))
	}
	return nil
}

// LoadCheckpoint implements eventstore.Checkpoints.
func (s *Store) LoadCheckpoint(ctx context.Context, name string) (int64, []byte, bool, error) {
	var (
		pos  int64
		data []byte
	)
	err := s.pool.QueryRow(ctx, "SELECT position, data FROM checkpoints WHERE name = $1", name).Scan(&pos, &data)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil, false, nil
	}
	if err != nil {
		return 0, nil, false, fmt.Errorf("load checkpoint %s: %w", name, classify(err))
	}
	return pos, data, true, nil
}
