package postgres

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
)

// migrations holds the schema, one file per version, named NNNN_what.sql.
// A released file never changes; a schema change is a new file.
//
//go:embed migrations/*.sql
var migrations embed.FS

// migrateLock is the key of the transaction-scoped advisory lock that
// migrations run under ("corral" and 1), so that servers starting together
// on one database apply each migration once: the second waits, then finds
// it applied.
const migrateLock int64 = 0x636f7272616c_0001

func loadMigrations() ([]eventstore.Migration, error) {
	return eventstore.LoadMigrations(migrations, "migrations")
}

// migrate applies every migration newer than the database's schema
// version, with its row in schema_version, and returns the resulting
// version. All of them go in one transaction (PostgreSQL's DDL is
// transactional: a failed migration leaves the schema as it was) under
// migrateLock. A database newer than this binary is refused.
func migrate(ctx context.Context, pool *pgxpool.Pool) (version int, err error) {
	ms, err := loadMigrations()
	if err != nil {
		return 0, fmt.Errorf("load migrations: %w", err)
	}
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return 0, fmt.Errorf("begin: %w", classify(err))
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx)) // report the error that caused it
		}
	}()
	// Before anything else, even the CREATE TABLE IF NOT EXISTS below,
	// which two servers running at once could both try.
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrateLock); err != nil {
		return 0, fmt.Errorf("take the migration lock: %w", classify(err))
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_version (
		version    integer     PRIMARY KEY,
		name       text        NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return 0, fmt.Errorf("create schema_version table: %w", classify(err))
	}
	var cur int
	if err := tx.QueryRow(ctx, "SELECT COALESCE(MAX(version), 0) FROM schema_version").Scan(&cur); err != nil {
		return 0, fmt.Errorf("read schema version: %w", classify(err))
	}
	if cur > len(ms) {
		return 0, fmt.Errorf("database schema version %d is newer than this binary's %d: %w",
			cur, len(ms), errdefs.ErrFailedPrecondition)
	}
	for _, m := range ms[cur:] {
		// No arguments: the simple protocol, which takes several
		// statements at once.
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return 0, fmt.Errorf("apply migration %s: %w", m.Name, classify(err))
		}
		if _, err := tx.Exec(ctx, "INSERT INTO schema_version (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
			return 0, fmt.Errorf("record migration %s: %w", m.Name, classify(err))
		}
		cur = m.Version
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("commit migrations: %w", classify(err))
	}
	return cur, nil
}
