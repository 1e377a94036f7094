package document

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/corral-dev/corral/internal/clip"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"unicode"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workspace"
)

// schemaVersion is the version of the index's tables. Changing the tables
// or what Sync puts in them bumps it; Open then drops them and Sync rebuilds
// from the events.
const schemaVersion = 1

// syncPage is how many events Sync reads and applies per write transaction:
// small enough that the transaction holds SQLite's write lock for
// milliseconds (the event writer waits for it), large enough that a rebuild
// of 100k documents takes a few hundred transactions.
const syncPage = 500

var schema = []string{
	`CREATE TABLE docindex_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) STRICT`,
	`CREATE TABLE docindex_docs (
		rowid       INTEGER PRIMARY KEY,
		document_id TEXT NOT NULL UNIQUE,
		kind        TEXT NOT NULL,
		doc         TEXT NOT NULL
	) STRICT`,
	// title, metadata and text (the porter stemmer makes "categories" find
	// "category"), and the kind.
	`CREATE VIRTUAL TABLE docindex_fts USING fts5(title, meta, body, tokenize = 'porter unicode61 remove_diacritics 2')`,
	// rank is BM25 with a match in the title worth five in the text, one in
	// the metadata two. Ordering by rank lets FTS5 hand rows over best
	// first, so the join, the kind filter and snippet() run only until the
	// LIMIT is reached (ordering by a bm25() expression instead ran
	// snippet() for every match: 33 ms instead of 6 for 2,000 matches).
	`INSERT INTO docindex_fts (docindex_fts, rank) VALUES ('rank', 'bm25(5.0, 2.0, 1.0)')`,
}

var dropSchema = []string{
	`DROP TABLE IF EXISTS docindex_fts`,
	`DROP TABLE IF EXISTS docindex_docs`,
	`DROP TABLE IF EXISTS docindex_meta`,
}

// Options configure an Index.
type Options struct {
	// Read is a pool for queries (it may be read-only); Write a handle for
	// the index's own writes, one connection. Both reach the same SQLite
	// database, with FTS5.
	Read, Write *sql.DB
	// Events is the event store the index is folded from.
	Events eventstore.Store
	// Files is documents/, where each document's file is.
	Files *os.Root
}

// Index is the document index. Its methods are safe for concurrent use;
// Sync calls are serialised.
type Index struct {
	read, write *sql.DB
	events      eventstore.Store
	files       *os.Root
	log         *slog.Logger

	mu     sync.Mutex // held by Sync
	cursor int64      // position of the last event applied; guarded by mu
}

// Open creates the index's tables if needed (dropping them first if they
// are of another schema version) and returns the index. Call Sync to bring
// it up to date with the events.
func Open(ctx context.Context, opts Options, log *slog.Logger) (*Index, error) {
	ix := &Index{read: opts.Read, write: opts.Write, events: opts.Events, files: opts.Files, log: log}
	var v string
	err := ix.write.QueryRowContext(ctx, `SELECT value FROM docindex_meta WHERE key = 'schema_version'`).Scan(&v)
	if err == nil && v == strconv.Itoa(schemaVersion) {
		var c string
		if err := ix.write.QueryRowContext(ctx, `SELECT value FROM docindex_meta WHERE key = 'cursor'`).Scan(&c); err != nil {
			return nil, fmt.Errorf("open document index: read cursor: %w", err)
		}
		ix.cursor, _ = strconv.ParseInt(c, 10, 64)
		return ix, nil
	}
	if err == nil {
		log.Info("document index schema changed; rebuilding from events", "from", v, "to", schemaVersion)
	}
	err = ix.tx(ctx, func(tx *sql.Tx) error {
		for _, q := range append(append([]string{}, dropSchema...), schema...) {
			if _, err := tx.ExecContext(ctx, q); err != nil {
				return fmt.Errorf("%s: %w", firstLine(q), err)
			}
		}
		_, err := tx.ExecContext(ctx, `INSERT INTO docindex_meta (key, value) VALUES ('schema_version', ?), ('cursor', '0')`, strconv.Itoa(schemaVersion))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create document index: %w", err)
	}
	return ix, nil
}

// Position returns the position of the last event the index applied.
func (ix *Index) Position() int64 {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.cursor
}

// Sync applies every event after the index's cursor: documents and notes
// are (re)indexed from their files, other events only move the cursor. It
// returns when the index has caught up with the store's head as of the call.
func (ix *Index) Sync(ctx context.Context) error {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for {
		evs, err := ix.events.ReadAll(ctx, ix.cursor, syncPage)
		if err != nil {
			return fmt.Errorf("sync document index: %w", err)
		}
		if len(evs) == 0 {
			return nil
		}
		var rows []row
		for _, e := range evs {
			if e.Type != task.EventDocumentIngested && e.Type != task.EventNoteCreated {
				continue
			}
			r, err := ix.rowOf(e)
			if err != nil {
				// A payload this version cannot read: skip it rather than
				// stop indexing everything after it.
				ix.log.Warn("cannot index document event", "event_id", e.ID, "err", err)
				continue
			}
			rows = append(rows, r)
		}
		last := evs[len(evs)-1].Position
		if err := ix.put(ctx, rows, last); err != nil {
			return fmt.Errorf("sync document index: %w", err)
		}
		ix.cursor = last
		if len(rows) > 0 {
			ix.log.Debug("documents indexed", "count", len(rows), "position", last)
		}
	}
}

// row is one document ready to index.
type row struct {
	doc  Doc
	meta string // metadata's string values, for the meta column
	text string
}

// rowOf reads a document event and its file.
func (ix *Index) rowOf(e eventstore.Event) (row, error) {
	var p task.DocumentIngested
	if err := json.Unmarshal(e.Data, &p); err != nil {
		return row{}, fmt.Errorf("decode %s: %w", e.Type, err)
	}
	if p.DocumentID == "" || p.File == "" {
		return row{}, fmt.Errorf("%s without document_id or file", e.Type)
	}
	d := Doc{DocumentIngested: p, CreatedAt: e.RecordedAt, Actor: e.Actor}
	r := row{doc: d, meta: metaText(p.Metadata)}
	data, truncated, err := workspace.ReadFile(ix.files, p.File, MaxIndexedText)
	if err != nil {
		r.doc.IndexNote = "the document's file cannot be read: " + err.Error()
		return r, nil
	}
	r.text, r.doc.Indexed, r.doc.IndexNote = Extract(p.ContentType, data, truncated)
	return r, nil
}

// metaText returns the string values (and keys) of a metadata object, for
// search: tags, a source task id, an author.
func metaText(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return ""
	}
	var parts []string
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			parts = append(parts, x)
		case float64, bool:
			parts = append(parts, fmt.Sprint(x))
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				parts = append(parts, k)
				walk(x[k])
			}
		}
	}
	walk(v)
	return strings.Join(parts, " ")
}

// put writes rows and the new cursor in one transaction. A document already
// indexed is replaced.
func (ix *Index) put(ctx context.Context, rows []row, cursor int64) error {
	return ix.tx(ctx, func(tx *sql.Tx) error {
		upsert, err := tx.PrepareContext(ctx, `INSERT INTO docindex_docs (document_id, kind, doc) VALUES (?, ?, ?)
			ON CONFLICT (document_id) DO UPDATE SET kind = excluded.kind, doc = excluded.doc RETURNING rowid`)
		if err != nil {
			return err
		}
		defer upsert.Close()
		del, err := tx.PrepareContext(ctx, `DELETE FROM docindex_fts WHERE rowid = ?`)
		if err != nil {
			return err
		}
		defer del.Close()
		ins, err := tx.PrepareContext(ctx, `INSERT INTO docindex_fts (rowid, title, meta, body) VALUES (?, ?, ?, ?)`)
		if err != nil {
			return err
		}
		defer ins.Close()
		for _, r := range rows {
			doc, err := json.Marshal(r.doc)
			if err != nil {
				return err
			}
			var id int64
			if err := upsert.QueryRowContext(ctx, r.doc.DocumentID, r.doc.Kind(), string(doc)).Scan(&id); err != nil {
				return fmt.Errorf("index document %s: %w", r.doc.DocumentID, err)
			}
			if _, err := del.ExecContext(ctx, id); err != nil {
				return fmt.Errorf("index document %s: %w", r.doc.DocumentID, err)
			}
			if _, err := ins.ExecContext(ctx, id, r.doc.Title, r.meta, r.text); err != nil {
				return fmt.Errorf("index document %s: %w", r.doc.DocumentID, err)
			}
		}
		_, err = tx.ExecContext(ctx, `UPDATE docindex_meta SET value = ? WHERE key = 'cursor'`, strconv.FormatInt(cursor, 10))
		return err
	})
}

func (ix *Index) tx(ctx context.Context, fn func(*sql.Tx) error) (err error) {
	tx, err := ix.write.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback() // the error that caused it is the one to report
		}
	}()
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// Get returns a document, or an error of class errdefs.ErrNotFound.
func (ix *Index) Get(ctx context.Context, id string) (Doc, error) {
	var raw string
	err := ix.read.QueryRowContext(ctx, `SELECT doc FROM docindex_docs WHERE document_id = ?`, id).Scan(&raw)
	if errors.Is(err, sql.ErrNoRows) {
		return Doc{}, fmt.Errorf("no document %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return Doc{}, fmt.Errorf("read document %s: %w", id, err)
	}
	var d Doc
	if err := json.Unmarshal([]byte(raw), &d); err != nil {
		return Doc{}, fmt.Errorf("decode document %s: %w", id, err)
	}
	return d, nil
}

// Search returns the documents that match q's words, best first (BM25; a
// match in the title counts five times one in the text, metadata twice).
// Every word of the query counts; a document need not have them all, and
// the more it has, the higher it ranks. Common English words are dropped
// when the query has others. A query without a word is ErrInvalidArgument.
func (ix *Index) Search(ctx context.Context, q Query) ([]Hit, error) {
	match, err := MatchExpr(q.Text)
	if err != nil {
		return nil, err
	}
	limit := q.Limit
	switch {
	case limit == 0:
		limit = DefaultLimit
	case limit < 1 || limit > MaxLimit:
		return nil, errdefs.Field("limit", fmt.Sprintf("must be between 1 and %d", MaxLimit))
	}
	switch q.Kind {
	case "", KindNote, KindDocument:
	default:
		return nil, errdefs.Field("type", fmt.Sprintf("%q is not a document type (note or document)", clip.String(q.Kind, 32)))
	}
	// The kind is filtered in the join, not in the MATCH: a "kind : note"
	// term intersects every match with the posting list of nearly every
	// document (39 ms instead of 6 over 100k notes).
	rows, err := ix.read.QueryContext(ctx, `SELECT d.doc, f.rank, snippet(docindex_fts, 2, '**', '**', '…', 16)
		FROM docindex_fts f JOIN docindex_docs d ON d.rowid = f.rowid
		WHERE docindex_fts MATCH ?1 AND (?2 = '' OR d.kind = ?2)
		ORDER BY f.rank LIMIT ?3`, match, q.Kind, limit)
	if err != nil {
		return nil, fmt.Errorf("search documents: %w", err)
	}
	defer rows.Close()
	hits := []Hit{}
	for rows.Next() {
		var raw, snippet string
		var score float64
		if err := rows.Scan(&raw, &score, &snippet); err != nil {
			return nil, fmt.Errorf("search documents: %w", err)
		}
		var h Hit
		if err := json.Unmarshal([]byte(raw), &h.Doc); err != nil {
			return nil, fmt.Errorf("search documents: decode: %w", err)
		}
		h.Score, h.Snippet = -score, snippet // rank (BM25) is lower for better matches
		hits = append(hits, h)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("search documents: %w", err)
	}
	return hits, nil
}

// MatchExpr turns a person's or a model's query into an FTS5 expression:
// its words (letters and digits), each quoted so that no character is FTS5
// syntax, joined with OR. Common English words are dropped if others
// remain; at most 32 words count. The error is a FieldError of field "q".
func MatchExpr(q string) (string, error) {
	words := strings.FieldsFunc(strings.ToLower(q), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	})
	var kept, stop []string
	seen := map[string]bool{}
	for _, w := range words {
		if seen[w] {
			continue
		}
		seen[w] = true
		if stopWords()[w] {
			stop = append(stop, w)
		} else {
			kept = append(kept, w)
		}
	}
	if len(kept) == 0 {
		kept = stop
	}
	if len(kept) == 0 {
		return "", errdefs.Field("q", "has no words to search for")
	}
	if len(kept) > maxTerms {
		kept = kept[:maxTerms]
	}
	for i, w := range kept {
		kept[i] = `"` + w + `"`
	}
	return strings.Join(kept, " OR "), nil
}

// stopWords are dropped from queries that have other words: matching them
// costs a scan of nearly every document and changes no ranking.
// Built on first use: the corral binary is also every sandbox's worker.
var stopWords = sync.OnceValue(func() map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(`a an and are as at be but by for from has have i if in into is it its
		my of on or our so that the their them then there these they this to was we were what when where
		which who will with you your`) {
		m[w] = true
	}
	return m
})

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
