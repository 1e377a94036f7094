package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// ReadModel is a SQLite database of its own for a read model folded from
// the events (the document index): never the event store's file, so the
// events can live in another store and a read model's writes never wait
// on, or hold up, an Append. Close it when done.
type ReadModel struct {
	// Read is a read-only pool for queries; Write is one connection for
	// the read model's own writes.
	Read, Write *sql.DB
}

// OpenReadModel opens (creating if needed, owner-only) the read-model
// database at path, in WAL mode with synchronous=NORMAL: a commit may be
// lost on power failure, which a read model rebuilt from events can
// afford.
func OpenReadModel(ctx context.Context, path string) (*ReadModel, error) {
	if path == "" || strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("open read model %q: path must be a plain file path: %w", path, errdefs.ErrInvalidArgument)
	}
	if f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		return nil, fmt.Errorf("open read model: %w", err)
	} else if err := f.Close(); err != nil {
		return nil, fmt.Errorf("open read model: %w", err)
	}
	q := url.Values{}
	q.Set("_busy_timeout", fmt.Sprint(busyTimeout.Milliseconds()))
	q.Set("_foreign_keys", "1")
	q.Set("_journal_mode", "WAL")
	q.Set("_synchronous", "NORMAL")
	q.Set("_txlock", "immediate")
	write, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open read model %s: %w", path, err)
	}
	write.SetMaxOpenConns(1)
	write.SetMaxIdleConns(1)
	write.SetConnMaxLifetime(0)
	write.SetConnMaxIdleTime(0)
	if err := write.PingContext(ctx); err != nil {
		write.Close()
		return nil, fmt.Errorf("open read model %s: %w", path, err)
	}
	rq := url.Values{}
	rq.Set("_busy_timeout", fmt.Sprint(busyTimeout.Milliseconds()))
	rq.Set("_query_only", "1")
	read, err := sql.Open("sqlite", path+"?"+rq.Encode())
	if err != nil {
		write.Close()
		return nil, fmt.Errorf("open read model %s: %w", path, err)
	}
	n := max(4, runtime.GOMAXPROCS(0))
	read.SetMaxOpenConns(n)
	read.SetMaxIdleConns(n)
	return &ReadModel{Read: read, Write: write}, nil
}

// Close closes both handles.
func (m *ReadModel) Close() error {
	rerr := m.Read.Close()
	if err := m.Write.Close(); err != nil {
		return err
	}
	return rerr
}
