package eventstore

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/ids"
)

// Committed returns the events a store commits for proposed, appended to
// stream after version cur and global position head at time at: each with
// its version and position, an id made for one that has none (made by the
// caller in commit order, so generated ids sort like positions), ctx's
// Cause stamped in order (Cause.Stamp), and its data copied (the caller may
// reuse its buffer). What is the same in every store's Append.
func Committed(ctx context.Context, stream string, cur, head int64, at time.Time, proposed []Proposed) []Event {
	cause := CauseOf(ctx)
	stamp := cause != Cause{}
	evs := make([]Event, len(proposed))
	for j, p := range proposed {
		e := Event{
			ID:            p.ID,
			StreamID:      stream,
			StreamVersion: cur + int64(j) + 1,
			Type:          p.Type,
			SchemaVersion: p.SchemaVersion,
			Actor:         p.Actor,
			CorrelationID: p.CorrelationID,
			CausationID:   p.CausationID,
			RecordedAt:    at,
			Position:      head + int64(j) + 1,
		}
		if e.ID == "" {
			e.ID = "evt_" + ids.New()
		}
		if stamp {
			cause.Stamp(&e)
		}
		if len(p.Data) > 0 {
			e.Data = append(json.RawMessage(nil), p.Data...)
		}
		evs[j] = e
	}
	return evs
}

// Migration is one schema change of a store, from a file named
// NNNN_what.sql: its version NNNN, the file's name and its SQL.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// LoadMigrations reads a store's migrations, the .sql files of dir in
// fsys, in version order; the versions must run 1, 2, 3, ... without a gap.
// A released file never changes; a schema change is a new file.
func LoadMigrations(fsys fs.FS, dir string) ([]Migration, error) {
	names, err := fs.Glob(fsys, path.Join(dir, "*.sql"))
	if err != nil {
		return nil, err
	}
	var ms []Migration
	for _, n := range names {
		base := path.Base(n)
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("migration %s: name must start with a positive number and '_'", base)
		}
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return nil, err
		}
		ms = append(ms, Migration{Version: v, Name: base, SQL: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Version < ms[j].Version })
	for i, m := range ms {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration %s: expected version %d", m.Name, i+1)
		}
	}
	return ms, nil
}
