package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
)

// migrations holds the schema, one file per version, named NNNN_what.sql.
// A released file never changes; a schema change is a new file.
//
//go:embed migrations/*.sql
var migrations embed.FS

func loadMigrations() ([]eventstore.Migration, error) {
	return eventstore.LoadMigrations(migrations, "migrations")
}

// migrate applies every migration newer than the database's schema version,
// each in its own transaction with its row in schema_version, and returns
// the resulting version. A database newer than this binary is refused.
func migrate(ctx context.Context, db *sql.DB) (int, error) {
	ms, err := loadMigrations()
	if err != nil {
		return 0, fmt.Errorf("load migrations: %w", err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (
		version    INTEGER PRIMARY KEY,
		name       TEXT NOT NULL,
		applied_at TEXT NOT NULL
	) STRICT`); err != nil {
		return 0, fmt.Errorf("create schema_version table: %w", err)
	}
	var cur int
	if err := db.QueryRowContext(ctx, "SELECT COALESCE(MAX(version), 0) FROM schema_version").Scan(&cur); err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	if cur > len(ms) {
		return 0, fmt.Errorf("database schema version %d is newer than this binary's %d: %w",
			cur, len(ms), errdefs.ErrFailedPrecondition)
	}
	for _, m := range ms[cur:] {
		if err := apply(ctx, db, m); err != nil {
			return 0, fmt.Errorf("apply migration %s: %w", m.Name, err)
		}
		cur = m.Version
	}
	return cur, nil
}

func apply(ctx context.Context, db *sql.DB, m eventstore.Migration) (err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback() // report the error that caused it
		}
	}()
	if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)",
		m.Version, m.Name, time.Now().UTC().Format(timeFormat)); err != nil {
		return err
	}
	return tx.Commit()
}
