package postgres

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/sqlite/sqlitetest"
)

// BenchmarkAppend measures appends per second on PostgreSQL, with every
// appender on one store and spread over two (two servers), and on SQLite
// (its group commit) in the same run for the ratio. Every appender owns a
// stream and appends one event at a time with the version it last wrote,
// as SQLite's BenchmarkAppend does. Both stores fsync each commit
// (PostgreSQL's synchronous_commit=on, SQLite's synchronous=FULL).
//
//	go test -run '^$' -bench BenchmarkAppend ./internal/eventstore/postgres
func BenchmarkAppend(b *testing.B) {
	for _, appenders := range []int{1, 16} {
		b.Run(fmt.Sprintf("postgres/stores=1/appenders=%d", appenders), func(b *testing.B) {
			s := mustOpen(b, mustDB(b))
			benchAppenders(b, []eventstore.Store{s}, appenders)
		})
		b.Run(fmt.Sprintf("postgres/stores=2/appenders=%d", appenders), func(b *testing.B) {
			db := mustDB(b)
			benchAppenders(b, []eventstore.Store{mustOpen(b, db), mustOpen(b, db)}, appenders)
		})
		b.Run(fmt.Sprintf("sqlite/appenders=%d", appenders), func(b *testing.B) {
			benchAppenders(b, []eventstore.Store{sqlitetest.Open(b)}, appenders)
		})
	}
}

var benchEvent = eventstore.Proposed{
	Type: "task.progress", SchemaVersion: 1, Actor: "agent",
	Data: []byte(`{"message":"ran the tests","step":12,"tokens":3456}`),
}

// benchAppenders runs b.N appends spread over n goroutines, taking the
// stores in turn, and reports appends per second.
func benchAppenders(b *testing.B, stores []eventstore.Store, n int) {
	ctx := context.Background()
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	errs := make(chan error, n)
	start := time.Now()
	b.ResetTimer()
	for g := range n {
		s := stores[g%len(stores)]
		wg.Go(func() {
			stream := fmt.Sprintf("bench-%d", g)
			var version int64
			for left.Add(-1) >= 0 {
				if _, err := s.Append(ctx, stream, version, benchEvent); err != nil {
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
