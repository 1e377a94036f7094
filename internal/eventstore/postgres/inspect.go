package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/errdefs"
)

// Report is what Inspect finds of a database: the server's version, the
// schema's (0 before the first server's start has made it) and this
// binary's, the live Corral servers (replicas) on it with their clocks,
// and how far the database's clock is from this machine's.
type Report struct {
	ServerVersion string
	Schema        int
	Binary        int
	Replicas      []cluster.Replica // live, by id
	ClockSkew     time.Duration     // the database's clock minus this machine's, about
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
	var table, replicas *string
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version'), clock_timestamp(), to_regclass('schema_version')::text, to_regclass('replicas')::text").
		Scan(&r.ServerVersion, &now, &table, &replicas); err != nil {
		return r, fmt.Errorf("ask the database: %w", classify(err))
	}
	// The middle of the round trip, against the database's reading.
	r.ClockSkew = now.Sub(before.Add(time.Since(before) / 2))
	if table != nil {
		if err := conn.QueryRow(ctx, "SELECT COALESCE(MAX(version), 0) FROM schema_version").Scan(&r.Schema); err != nil {
			return r, fmt.Errorf("read the schema version: %w", classify(err))
		}
	}
	if replicas == nil {
		return r, nil
	}
	rows, err := conn.Query(ctx, `SELECT id, host, url, runtimes, clock_skew_ms, started_at FROM replicas
		WHERE renewed_at > now() - make_interval(secs => $1) ORDER BY id`, cluster.TTL.Seconds())
	if err != nil {
		return r, fmt.Errorf("read the replicas: %w", classify(err))
	}
	defer rows.Close()
	for rows.Next() {
		var rep cluster.Replica
		var ms int64
		if err := rows.Scan(&rep.ID, &rep.Host, &rep.URL, &rep.Runtimes, &ms, &rep.Started); err != nil {
			return r, fmt.Errorf("read the replicas: %w", classify(err))
		}
		rep.ClockSkew = time.Duration(ms) * time.Millisecond
		r.Replicas = append(r.Replicas, rep)
	}
	if err := rows.Err(); err != nil {
		return r, fmt.Errorf("read the replicas: %w", classify(err))
	}
	return r, nil
}
