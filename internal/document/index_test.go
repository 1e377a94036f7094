package document

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/sqlite"
	"github.com/corral-dev/corral/internal/task"
)

// env is an index over a real SQLite event store in a temporary directory.
type env struct {
	once  sync.Once
	store *sqlite.Store
	db    *sqlite.ReadModel
	files *os.Root
	dir   string
	ix    *Index
}

// MustOpen opens an event store, documents/ and an index on them.
func MustOpen(tb testing.TB, dir string) *env {
	tb.Helper()
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	if err := os.MkdirAll(filepath.Join(dir, "documents"), 0o755); err != nil {
		tb.Fatal(err)
	}
	st, err := sqlite.Open(ctx, filepath.Join(dir, "corral.db"), log)
	if err != nil {
		tb.Fatal(err)
	}
	db, err := sqlite.OpenReadModel(ctx, filepath.Join(dir, "documents.db"))
	if err != nil {
		tb.Fatal(err)
	}
	files, err := os.OpenRoot(filepath.Join(dir, "documents"))
	if err != nil {
		tb.Fatal(err)
	}
	ix, err := Open(ctx, Options{Read: db.Read, Write: db.Write, Events: st, Files: files}, log)
	if err != nil {
		tb.Fatal(err)
	}
	e := &env{store: st, db: db, files: files, dir: dir, ix: ix}
	tb.Cleanup(e.close)
	return e
}

func (e *env) close() {
	e.once.Do(func() {
		e.db.Close()
		e.store.Close()
		e.files.Close()
	})
}

// add writes a document's file and appends its event.
func (e *env) add(tb testing.TB, typ, title, sourceType, name, content string, meta any) string {
	tb.Helper()
	id := NewID()
	file := FileName(id, name)
	if err := os.WriteFile(filepath.Join(e.dir, "documents", file), []byte(content), 0o644); err != nil {
		tb.Fatal(err)
	}
	p := task.DocumentIngested{DocumentID: id, Title: title, SourceType: sourceType, File: file, Name: name,
		ContentType: ContentType(name, []byte(content)), Size: int64(len(content))}
	if meta != nil {
		p.Metadata, _ = json.Marshal(meta)
	}
	data, _ := json.Marshal(p)
	if _, err := e.store.Append(context.Background(), task.DocumentStreamID(id), 0,
		eventstore.Proposed{Type: typ, SchemaVersion: task.SchemaVersion, Data: data, Actor: "test"}); err != nil {
		tb.Fatal(err)
	}
	return id
}

func titles(hits []Hit) []string {
	var out []string
	for _, h := range hits {
		out = append(out, h.Title)
	}
	return out
}

func TestSearchRanksAndFilters(t *testing.T) {
	e := MustOpen(t, t.TempDir())
	ctx := context.Background()
	e.add(t, task.EventNoteCreated, "Budget categories", SourceNote, "budget.md", "Food, rent and transport are our budget categories.", map[string]any{"tags": []string{"money"}})
	e.add(t, task.EventNoteCreated, "Holiday plans", SourceNote, "holiday.md", "We go hiking in June; the budget is small.", nil)
	e.add(t, task.EventNoteCreated, "Garden", SourceNote, "garden.md", "Tomatoes and beans.", nil)
	e.add(t, task.EventDocumentIngested, "Spending report", SourceWorkerOutput, "report.csv", "category,amount\nfood,12\nrent,900\n", nil)
	e.add(t, task.EventDocumentIngested, "Statement", SourceImported, "statement.pdf", "%PDF-1.7 binary", nil)
	// An unrelated event between them only moves the cursor.
	if _, err := e.store.Append(ctx, "task/x", 0, eventstore.Proposed{Type: "task_created", Data: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if err := e.ix.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	head, _ := e.store.ReadAll(ctx, 0, 100)
	if got, want := e.ix.Position(), head[len(head)-1].Position; got != want {
		t.Errorf("cursor %d, want %d", got, want)
	}

	hits, err := e.ix.Search(ctx, Query{Text: "budget categories"})
	if err != nil {
		t.Fatal(err)
	}
	// The note with both words ranks first; the others have one each
	// ("categories" is stemmed, so the report's "category" matches).
	got := titles(hits)
	if len(got) != 3 || got[0] != "Budget categories" || !slices.Contains(got, "Holiday plans") || !slices.Contains(got, "Spending report") {
		t.Errorf("budget categories: %v", got)
	}
	if len(hits) < 2 || hits[0].Score <= hits[1].Score || !strings.Contains(hits[0].Snippet, "**budget**") {
		t.Errorf("scores %v %v, snippet %q", hits[0].Score, hits[1].Score, hits[0].Snippet)
	}
	// Stemming, metadata, the kind filter.
	for _, tc := range []struct {
		q    Query
		want []string
	}{
		{Query{Text: "category"}, []string{"Budget categories", "Spending report"}},
		{Query{Text: "category", Kind: KindNote}, []string{"Budget categories"}},
		{Query{Text: "category", Kind: KindDocument}, []string{"Spending report"}},
		{Query{Text: "money"}, []string{"Budget categories"}},
		{Query{Text: "statement"}, []string{"Statement"}}, // the PDF by its title
		{Query{Text: "binary"}, nil},                      // not by its content
		{Query{Text: `"rent" OR NEAR(x) -- the*`}, []string{"Spending report", "Budget categories"}},
		{Query{Text: "the and of tomatoes"}, []string{"Garden"}},
		{Query{Text: "budget", Limit: 1}, []string{"Budget categories"}},
	} {
		hits, err := e.ix.Search(ctx, tc.q)
		if err != nil {
			t.Errorf("%+v: %v", tc.q, err)
			continue
		}
		if got := titles(hits); !slices.Equal(got, tc.want) {
			t.Errorf("%+v: %v, want %v", tc.q, got, tc.want)
		}
	}
	for _, q := range []Query{{Text: "  ?! "}, {Text: "x", Limit: 101}, {Text: "x", Kind: "pdf"}} {
		if _, err := e.ix.Search(ctx, q); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%+v: error %v, want invalid argument", q, err)
		}
	}
}

func TestGetAndIndexedFlags(t *testing.T) {
	e := MustOpen(t, t.TempDir())
	ctx := context.Background()
	pdf := e.add(t, task.EventDocumentIngested, "Statement", SourceImported, "statement.pdf", "%PDF-1.7", nil)
	png := e.add(t, task.EventDocumentIngested, "Chart", SourceWorkerOutput, "chart.png", "\x89PNG\r\n\x1a\n\x00\x00", nil)
	md := e.add(t, task.EventNoteCreated, "Note", SourceNote, "n.md", "hello", nil)
	if err := e.ix.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]bool{pdf: false, png: false, md: true} {
		d, err := e.ix.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if d.Indexed != want || (!want && d.IndexNote == "") {
			t.Errorf("%s (%s): indexed %v (%q), want %v", id, d.Name, d.Indexed, d.IndexNote, want)
		}
		if d.Actor != "test" || d.CreatedAt.IsZero() {
			t.Errorf("%s: actor %q, created %v", id, d.Actor, d.CreatedAt)
		}
	}
	if _, err := e.ix.Get(ctx, NewID()); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown id: %v", err)
	}
}

// TestRebuild checks the index is a read model: reopened with its tables
// gone (or of another schema version), it is rebuilt from the events and
// the files alone.
func TestRebuild(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	e := MustOpen(t, dir)
	e.add(t, task.EventNoteCreated, "Alpha", SourceNote, "a.md", "zebra crossing", nil)
	if err := e.ix.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	e.add(t, task.EventNoteCreated, "Beta", SourceNote, "b.md", "zebra stripes", nil) // not yet synced
	e.close()

	// Reopen: the cursor persisted, the second note is picked up.
	e2 := MustOpen(t, dir)
	if err := e2.ix.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	hits, err := e2.ix.Search(ctx, Query{Text: "zebra"})
	if err != nil || len(hits) != 2 {
		t.Fatalf("after reopen: %v, %v", titles(hits), err)
	}
	// An old schema version: the tables are dropped and rebuilt.
	if _, err := e2.db.Write.ExecContext(ctx, `UPDATE docindex_meta SET value = '0' WHERE key = 'schema_version'`); err != nil {
		t.Fatal(err)
	}
	e2.close()
	e3 := MustOpen(t, dir)
	if got := e3.ix.Position(); got != 0 {
		t.Errorf("cursor after schema change %d, want 0", got)
	}
	if hits, _ := e3.ix.Search(ctx, Query{Text: "zebra"}); len(hits) != 0 {
		t.Errorf("before sync: %v", titles(hits))
	}
	if err := e3.ix.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	hits, err = e3.ix.Search(ctx, Query{Text: "zebra"})
	if err != nil || !slices.Equal(titles(hits), []string{"Alpha", "Beta"}) && !slices.Equal(titles(hits), []string{"Beta", "Alpha"}) {
		t.Errorf("after rebuild: %v, %v", titles(hits), err)
	}
}

func TestMatchExpr(t *testing.T) {
	for in, want := range map[string]string{
		"budget categories":     `"budget" OR "categories"`,
		`what's "x" AND y*`:     `"s" OR "x" OR "y"`,
		"the of":                `"the" OR "of"`,
		"Café CAFÉ":             `"café"`,
		"notes for the project": `"notes" OR "project"`,
		"NEAR(a b) -c ^d col:e": `"near" OR "b" OR "c" OR "d" OR "col" OR "e"`,
	} {
		got, err := MatchExpr(in)
		if err != nil || got != want {
			t.Errorf("MatchExpr(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

func TestExtract(t *testing.T) {
	for _, tc := range []struct {
		name, typ, data string
		truncated       bool
		indexed         bool
		note            bool
	}{
		{"text", "text/plain; charset=utf-8", "hello", false, true, false},
		{"json", "application/json", `{"a":"b"}`, false, true, false},
		{"pdf", "application/pdf", "%PDF", false, false, true},
		{"binary", "application/octet-stream", "a\x00b", false, false, true},
		{"latin1", "text/plain", "caf\xe9", false, false, true},
		{"cut mid-rune", "text/plain", "abc\xc3", true, true, true},
		{"empty", "text/plain", "", false, true, false},
	} {
		text, indexed, note := Extract(tc.typ, []byte(tc.data), tc.truncated)
		if indexed != tc.indexed || (note != "") != tc.note {
			t.Errorf("%s: indexed %v note %q", tc.name, indexed, note)
		}
		if indexed && strings.ContainsRune(text, '\uFFFD') {
			t.Errorf("%s: text %q has a replacement character", tc.name, text)
		}
	}
}

func TestNames(t *testing.T) {
	for in, want := range map[string]string{
		"report.md": "report.md", "../../etc/passwd": "passwd", "a b/c d.csv": "c_d.csv",
		".hidden": "hidden", "": "file", "é.txt": "_.txt", strings.Repeat("x", 200) + ".csv": strings.Repeat("x", 96) + ".csv",
	} {
		if got := SafeName(in, 100); got != want {
			t.Errorf("SafeName(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{
		"Project Alpha: Summary!": "project-alpha-summary", "  ": "note", "Ünïcode ok": "n-code-ok",
	} {
		if got := Slug(in, 60); got != want {
			t.Errorf("Slug(%q) = %q, want %q", in, got, want)
		}
	}
}
