package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/ids"
)

// BenchmarkAppend compares the store's group commit with the nearest
// alternative: one transaction per append on the same file settings (WAL,
// synchronous=FULL, BEGIN IMMEDIATE, one write connection), each with the
// same expected-version check. Every appender owns a stream and appends one
// event at a time with the version it last wrote.
//
//	go test -run '^$' -bench BenchmarkAppend ./internal/eventstore/sqlite
func BenchmarkAppend(b *testing.B) {
	for _, appenders := range []int{1, 16} {
		b.Run(fmt.Sprintf("group-commit/appenders=%d", appenders), func(b *testing.B) {
			s := MustOpenTemp(b)
			benchAppenders(b, appenders, func(ctx context.Context, stream string, version int64) error {
				_, err := s.Append(ctx, stream, version, benchEvent)
				return err
			})
		})
		b.Run(fmt.Sprintf("tx-per-append/appenders=%d", appenders), func(b *testing.B) {
			db := mustOpenTxPerAppend(b)
			benchAppenders(b, appenders, func(ctx context.Context, stream string, version int64) error {
				return txPerAppend(ctx, db, stream, version, benchEvent)
			})
		})
	}
}

var benchEvent = eventstore.Proposed{
	Type: "task.progress", SchemaVersion: 1, Actor: "agent",
	Data: []byte(`{"message":"ran the tests","step":12,"tokens":3456}`),
}

// benchAppenders runs b.N appends spread over n goroutines and reports
// appends per second.
func benchAppenders(b *testing.B, n int, appendOne func(ctx context.Context, stream string, version int64) error) {
	ctx := context.Background()
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := time.Now()
	b.ResetTimer()
	for g := range n {
		wg.Go(func() {
			stream := fmt.Sprintf("bench-%d", g)
			var version int64
			for left.Add(-1) >= 0 {
				if err := appendOne(ctx, stream, version); err != nil {
					errs <- err
					return
				}
				version++
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "appends/s")
}

// mustOpenTxPerAppend opens a database with the store's writer settings
// and schema, without the group-commit writer.
func mustOpenTxPerAppend(tb testing.TB) *sql.DB {
	tb.Helper()
	q := url.Values{}
	q.Set("_busy_timeout", "5000")
	q.Set("_foreign_keys", "1")
	q.Set("_journal_mode", "WAL")
	q.Set("_synchronous", "FULL")
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", filepath.Join(tb.TempDir(), "corral.db")+"?"+q.Encode())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	// One connection: database/sql queues the appenders, as SQLite would
	// serialize them on its write lock anyway (without busy-wait sleeps).
	db.SetMaxOpenConns(1)
	if _, err := migrate(context.Background(), db); err != nil {
		tb.Fatal(err)
	}
	return db
}

func txPerAppend(ctx context.Context, db *sql.DB, stream string, expected int64, p eventstore.Proposed) (err error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	var cur int64
	if err := tx.QueryRowContext(ctx,
		"SELECT COALESCE(MAX(stream_version), 0) FROM events WHERE stream_id = ?", stream).Scan(&cur); err != nil {
		return err
	}
	if cur != expected {
		return fmt.Errorf("stream %s at %d, expected %d: %w", stream, cur, expected, eventstore.ErrVersionConflict)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO events (event_id, stream_id, stream_version, type,
		schema_version, data, actor, correlation_id, causation_id, recorded_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, '', '', ?)`,
		"evt_"+ids.New(), stream, cur+1, p.Type, p.SchemaVersion, string(p.Data), p.Actor,
		time.Now().UTC().Format(timeFormat)); err != nil {
		return err
	}
	return tx.Commit()
}
