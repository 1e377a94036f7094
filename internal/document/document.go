// Package document is Corral's document index: files ingested into
// documents/ and notes pushed by the host, searchable with ranked full-text
// search (SQLite FTS5, BM25).
//
// The index is a read model. The source of truth is two things: a
// document_ingested or note_created event per document (title, type,
// metadata, the file's name, size and sha256) and the file itself in
// documents/<id>_<name> (the content; a pushed note is written there as a
// Markdown file before its event). Sync folds those events into the index's
// tables, reading each file to extract its text, and records the last event
// position it applied in the same transaction. Dropping the tables (or a
// schema change: the index keeps its own schema version and rebuilds from
// event position 0 when it differs) therefore loses nothing.
//
// The tables live in the event store's SQLite file, reached through
// database/sql handles the caller passes in (package app opens them with the
// eventstore/sqlite driver), so this package never imports a driver. FTS5 is
// SQLite's: another store needs another index behind the same methods.
package document

import (
	"bytes"
	"fmt"
	"mime"
	"path"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/clip"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/ids"
	"github.com/corral-dev/corral/internal/task"
)

// Source types (the seed's ingest_from_workspace enum, plus note).
const (
	SourceWorkerOutput = "worker_output"
	SourceGenerated    = "generated"
	SourceImported     = "imported"
	SourceNote         = "note"
)

// SourceTypes are the valid source types.
var SourceTypes = []string{SourceWorkerOutput, SourceGenerated, SourceImported, SourceNote}

// Kinds of document, for filtering a search.
const (
	KindNote     = "note"     // source type note
	KindDocument = "document" // everything else
)

// MaxIndexedText bounds the text indexed per document; the rest of a longer
// file is stored but not searchable, and the document says so.
const MaxIndexedText = 4 << 20

// Doc is a document as the index knows it.
type Doc struct {
	task.DocumentIngested
	CreatedAt time.Time `json:"created_at"`
	Actor     string    `json:"actor,omitempty"`
	// Indexed says whether the content's text is searchable; the title and
	// metadata always are. IndexNote says why not, or what was left out.
	Indexed   bool   `json:"indexed"`
	IndexNote string `json:"index_note,omitempty"`
}

// Kind returns KindNote or KindDocument.
func (d Doc) Kind() string { return KindOf(d.SourceType) }

// KindOf returns the kind of a source type.
func KindOf(sourceType string) string {
	if sourceType == SourceNote {
		return KindNote
	}
	return KindDocument
}

// Hit is one search result.
type Hit struct {
	Doc
	// Score is the BM25 relevance, higher is better.
	Score float64 `json:"score"`
	// Snippet is the matching part of the text, matches in **bold**.
	Snippet string `json:"snippet,omitempty"`
}

// Query is a search.
type Query struct {
	Text  string // words; every word counts, documents with more rank higher
	Kind  string // "", KindNote or KindDocument
	Limit int    // 1..MaxLimit; 0 is DefaultLimit
}

// Search limits.
const (
	DefaultLimit = 20
	MaxLimit     = 100
	maxTerms     = 32
)

// NewID returns a new document id: "doc-" and a sortable id.
func NewID() string { return "doc-" + ids.New() }

// CheckID reports whether id is a well-formed document id, as a FieldError
// of field.
func CheckID(field, id string) error {
	rest, ok := strings.CutPrefix(id, "doc-")
	if !ok || !ids.Valid(rest) {
		return errdefs.Field(field, fmt.Sprintf("%q is not a document id (want doc- and 26 lowercase letters or digits)", clip.String(id, 64)))
	}
	return nil
}

// FileName returns the name a document's file has under documents/:
// "<id>_<name>", with the name reduced to letters, digits, '.', '-' and '_'
// and cut to 100 bytes, keeping its extension.
func FileName(id, name string) string {
	return id + "_" + SafeName(name, 100)
}

// SafeName reduces a file name to ASCII letters, digits, '.', '-' and '_'
// (others become '_'), at most n bytes, keeping the extension; never empty,
// never starting with '.'.
func SafeName(name string, n int) string {
	name = path.Base(strings.ReplaceAll(name, "\\", "/"))
	var b strings.Builder
	for _, r := range name {
		switch {
		case r < utf8.RuneSelf && (unicode.IsLetter(r) || unicode.IsDigit(r) || r == '.' || r == '-' || r == '_'):
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	s := strings.TrimLeft(b.String(), ".")
	if s == "" || s == "_" {
		s = "file"
	}
	if len(s) > n {
		ext := path.Ext(s)
		if len(ext) > n/2 {
			ext = ""
		}
		s = s[:n-len(ext)] + ext
	}
	return s
}

// Slug turns a title into a file-name stem: lowercase letters and digits
// joined by '-', at most n bytes; "note" when nothing is left.
func Slug(title string, n int) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(title) {
		if r < utf8.RuneSelf && (unicode.IsLetter(r) || unicode.IsDigit(r)) {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			dash = false
			b.WriteRune(r)
			if b.Len() >= n {
				break
			}
		} else {
			dash = true
		}
	}
	s := strings.TrimRight(b.String(), "-")
	if s == "" {
		return "note"
	}
	return s
}

// ContentType returns the MIME type of a document by its name, sniffing
// data when the extension says nothing.
func ContentType(name string, data []byte) string {
	switch strings.ToLower(path.Ext(name)) {
	case ".md", ".markdown":
		return "text/markdown; charset=utf-8"
	case ".csv":
		return "text/csv; charset=utf-8"
	case ".json":
		return "application/json"
	case ".jsonl", ".ndjson":
		return "application/jsonl"
	case ".txt", ".log", ".text":
		return "text/plain; charset=utf-8"
	case ".pdf":
		return "application/pdf"
	}
	if t := mime.TypeByExtension(path.Ext(name)); t != "" {
		return t
	}
	return sniff(data)
}

// Extract returns the searchable text of a document's content: plain text,
// Markdown, CSV and JSON (and any other UTF-8 text) as they are. A PDF or
// other binary content has no text here; note says so. Content longer than
// MaxIndexedText is indexed up to there (the caller passes at most
// MaxIndexedText+1 bytes, so truncated is known).
//
// PDFs: no well-kept pure-Go library extracts a PDF's text layer
// (rsc.io/pdf is unmaintained since 2015, its forks lightly kept; pdfcpu
// does not extract text; unipdf is not open source), so a PDF is stored and
// found by its title and metadata only.
func Extract(contentType string, data []byte, truncated bool) (text string, indexed bool, note string) {
	base, _, _ := strings.Cut(contentType, ";")
	switch {
	case base == "application/pdf":
		return "", false, "PDF text is not extracted (no well-kept pure-Go PDF text library); the title and metadata are searchable"
	case len(data) == 0:
		return "", true, ""
	}
	probe := data[:min(len(data), 8192)]
	if bytes.IndexByte(probe, 0) >= 0 || !utf8.Valid(trimIf(probe, len(data) > len(probe) || truncated)) {
		return "", false, fmt.Sprintf("binary content (%s) is stored but not indexed; the title and metadata are searchable", base)
	}
	if truncated {
		data = clip.TrimPartialRune(data)
		note = fmt.Sprintf("only the first %d MiB of the text is indexed", MaxIndexedText>>20)
	}
	return strings.ToValidUTF8(string(data), "\uFFFD"), true, note
}

func sniff(data []byte) string {
	probe := data[:min(len(data), 8192)]
	if bytes.IndexByte(probe, 0) < 0 && utf8.Valid(trimIf(probe, len(data) > len(probe))) {
		return "text/plain; charset=utf-8"
	}
	return "application/octet-stream"
}

// trimIf is clip.TrimPartialRune when b was cut from something longer.
func trimIf(b []byte, cut bool) []byte {
	if !cut {
		return b
	}
	return clip.TrimPartialRune(b)
}
