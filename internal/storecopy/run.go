package storecopy

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/postgres"
	"github.com/corral-dev/corral/internal/eventstore/sqlite"
	"github.com/corral-dev/corral/internal/lockfile"
)

// The stores a copy goes between, by store.driver's names.
const (
	SQLite   = "sqlite"
	Postgres = "postgres"
)

// Stores says where the two stores are.
type Stores struct {
	// SQLite is the data root's event log, its corral.db.
	SQLite string
	// Postgres is the PostgreSQL connection string. It is a secret (it
	// may hold a password): nothing here repeats it.
	Postgres string
	// Log takes the stores' own log lines; nil discards them.
	Log *slog.Logger
}

// Run copies the log from the store from names (SQLite or Postgres) into
// the other, as Copy does, and closes both. It opens the source first, so
// that a refusal there leaves the target untouched, and refuses to start
// while a Corral server uses either store: one on the data root holds its
// lock file (corral.db.lock, which a server takes whatever its store),
// and Run takes it as the SQLite store does, for the whole copy; one on
// the PostgreSQL database is a live replica there (postgres.Inspect). That
// second check happens once, before the copy: a server starting on the
// database during the copy makes it fail (its appends move the head the
// next batch must start at, or the verification finds the source longer)
// rather than go wrong. A SQLite source must exist; a SQLite target is made
// if missing, with its directory.
func Run(ctx context.Context, from string, st Stores, opts Options) (r Report, err error) {
	var to string
	switch from {
	case SQLite:
		to = Postgres
	case Postgres:
		to = SQLite
	default:
		return r, fmt.Errorf("copy from store %q: it must be %s or %s: %w", from, SQLite, Postgres, errdefs.ErrInvalidArgument)
	}
	if st.Log == nil {
		st.Log = slog.New(slog.DiscardHandler)
	}
	src, srcName, err := st.open(ctx, from, true)
	if err != nil {
		return r, err
	}
	defer func() {
		if cerr := src.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close the source: %w", cerr)
		}
	}()
	dst, dstName, err := st.open(ctx, to, false)
	if err != nil {
		return r, err
	}
	defer func() {
		if cerr := dst.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close the target: %w", cerr)
		}
	}()
	r, err = Copy(ctx, src, dst, opts)
	r.From, r.To = srcName, dstName
	return r, err
}

// open opens the store which names, as the source or the target, and
// returns it with its name for messages.
func (st Stores) open(ctx context.Context, which string, source bool) (eventstore.Importer, string, error) {
	if which == SQLite {
		s, err := openSQLite(ctx, st.SQLite, source, st.Log)
		if err != nil {
			return nil, "", err
		}
		return s, "SQLite " + st.SQLite, nil
	}
	s, err := openPostgres(ctx, st.Postgres, st.Log)
	if err != nil {
		return nil, "", err
	}
	return s, "PostgreSQL " + s.Target(), nil
}

// openSQLite opens the SQLite store at path, the source (which must
// exist) or the target (made if missing), once it has made sure no server
// holds the data root.
func openSQLite(ctx context.Context, path string, source bool, log *slog.Logger) (*sqlite.Store, error) {
	if path == "" {
		return nil, fmt.Errorf("open the SQLite event log: no path: %w", errdefs.ErrInvalidArgument)
	}
	dir := filepath.Dir(path)
	if source {
		fi, err := os.Stat(path)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("no event log at %s: nothing to copy: %w", path, errdefs.ErrNotFound)
		}
		if err != nil {
			return nil, fmt.Errorf("open the source: %w", err)
		}
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("open the source: %s is not a file: %w", path, errdefs.ErrInvalidArgument)
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil { // as the server makes the data root
		return nil, fmt.Errorf("make the data root: %w", err)
	}
	// Asked first, and apart, for a message that says what to do: the
	// store takes the same lock again at once (a server starting in
	// between makes Open fail with the lock's own message).
	l, err := lockfile.Acquire(path + ".lock")
	if err != nil {
		return nil, fmt.Errorf("a Corral server is running on the data root %s: stop it before copying its event log: %w", dir, err)
	}
	if err := l.Release(); err != nil {
		return nil, err
	}
	s, err := sqlite.Open(ctx, path, log)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// openPostgres opens the PostgreSQL store dsn names, once it has made sure
// no Corral server uses the database.
func openPostgres(ctx context.Context, dsn string, log *slog.Logger) (*postgres.Store, error) {
	if dsn == "" {
		return nil, fmt.Errorf("open the PostgreSQL event log: no connection string: %w", errdefs.ErrInvalidArgument)
	}
	rep, err := postgres.Inspect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("open the PostgreSQL event log: %w", err)
	}
	if len(rep.Replicas) > 0 {
		var who []string
		for _, r := range rep.Replicas {
			who = append(who, fmt.Sprintf("%s on %s", r.ID, r.Host))
		}
		return nil, fmt.Errorf("open the PostgreSQL event log: Corral servers use the database (%s): stop them before copying its event log: %w",
			strings.Join(who, ", "), errdefs.ErrFailedPrecondition)
	}
	return postgres.Open(ctx, dsn, log)
}
