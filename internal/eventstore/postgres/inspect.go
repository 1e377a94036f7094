package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Report is what Inspect finds of a database: the server's version, the
// schema's (0 before the first server's start has made it) and this
// binary's, the server lock's holder, and how far the database's clock is
// from this machine's.
type Report struct {
	ServerVersion string
	Schema        int
	Binary        int
	ServerRunning bool          // a Corral server holds the lock (LockServer)
	ClockSkew     time.Duration // the database's clock minus this machine's, about
}

// Inspect connects to the database dsn names and reports on it, changing
// nothing. Its errors are classed as Open's and say nothing of the dsn.
func Inspect(ctx context.Context, dsn string) (Report, error) {
	ms, err := loadMigrations()
	if err != nil {
		return Report{}, err
	}
	r := Report{Binary: len(ms)}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return r, fmt.Errorf("the PostgreSQL connection string does not parse (it is not repeated here, as it may hold a password): %w", errdefs.ErrInvalidArgument)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return r, fmt.Errorf("database %q on %s port %d: %w", cfg.Database, cfg.Host, cfg.Port, classify(err))
	}
	defer closeConn(conn)
	before := time.Now()
	var now time.Time
	var table *string
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version'), clock_timestamp(), to_regclass('schema_version')::text").
		Scan(&r.ServerVersion, &now, &table); err != nil {
		return r, fmt.Errorf("ask the database: %w", classify(err))
	}
	// The middle of the round trip, against the database's reading.
	r.ClockSkew = now.Sub(before.Add(time.Since(before) / 2))
	if table != nil {
		if err := conn.QueryRow(ctx, "SELECT COALESCE(MAX(version), 0) FROM schema_version").Scan(&r.Schema); err != nil {
			return r, fmt.Errorf("read the schema version: %w", classify(err))
		}
	}
	// Looked at in pg_locks, not taken: a server starting meanwhile must
	// not find it held. A bigint key is held as classid (its high 32 bits)
	// and objid (its low 32 bits), with objsubid 1.
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND classid::bigint = $1 AND objid::bigint = $2 AND objsubid = 1)`,
		serverLockKey>>32, serverLockKey&0xffffffff).Scan(&r.ServerRunning); err != nil {
		return r, fmt.Errorf("look at the server lock: %w", classify(err))
	}
	return r, nil
}
