package library

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/service"

	"github.com/corral-dev/corral/internal/document"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/units"
	"github.com/corral-dev/corral/internal/workspace"
)

// Document limits that are not configurable.
const (
	maxDocumentBytes  = 64 << 20 // a file ingested into documents/
	maxTitleBytes     = 500
	maxMetadataBytes  = 16 << 10
	maxDocumentIDs    = 50
	maxQueryBytes     = 1000
	maxNotesInContext = 20 // notes note_query brings into a task
	defaultExportMax  = 20
)

func (o *Library) documents() (*document.Index, error) {
	if o.opts.Documents == nil {
		return nil, fmt.Errorf("the document index is not enabled on this server: %w", errdefs.ErrNotImplemented)
	}
	return o.opts.Documents, nil
}

// IngestDocument copies a workspace file into documents/ (or writes a
// pushed note there), records document_ingested (note_created for a pushed
// note) and indexes it. Nothing is written when the input is bad.
func (o *Library) IngestDocument(ctx context.Context, req service.IngestRequest) (service.Document, error) {
	ix, err := o.documents()
	if err != nil {
		return service.Document{}, err
	}
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, errdefs.Field(field, fmt.Sprintf(format, args...)))
	}
	title := strings.TrimSpace(req.Title)
	switch {
	case title == "":
		bad("title", "is required")
	case len(title) > maxTitleBytes || !utf8.ValidString(title) || strings.ContainsRune(title, 0):
		bad("title", "must be UTF-8 text of at most %d bytes", maxTitleBytes)
	}
	switch {
	case req.Content != nil && req.SourcePath != "":
		bad("content", "give either source_path (a workspace file) or content (a note), not both")
	case req.Content == nil && strings.TrimSpace(req.SourcePath) == "":
		bad("source_path", "is required (or content, for a note)")
	}
	st := req.SourceType
	switch req.DocumentType {
	case "":
	case document.SourceNote:
		if st != "" && st != document.SourceNote {
			bad("document_type", "note contradicts source_type %q", clip.String(st, 32))
		}
		st = document.SourceNote
	default:
		bad("document_type", "%q is not a document type (note, or leave it out and use source_type)", clip.String(req.DocumentType, 32))
	}
	if st == "" {
		st = document.SourceWorkerOutput
		if req.Content != nil {
			st = document.SourceNote
		}
	}
	if !slices.Contains(document.SourceTypes, st) {
		bad("source_type", "%q is not a source type (one of: %s)", clip.String(st, 32), strings.Join(document.SourceTypes, ", "))
	}
	meta, err := checkMetadata(req.Metadata)
	if err != nil {
		errs = append(errs, err)
	}
	if c := req.Content; c != nil {
		switch {
		case !utf8.ValidString(*c) || strings.ContainsRune(*c, 0):
			bad("content", "must be UTF-8 text without NUL bytes")
		case o.opts.Limits.MaxWriteBytes > 0 && int64(len(*c)) > o.opts.Limits.MaxWriteBytes:
			errs = append(errs, &errdefs.FieldError{Field: "content", Err: fmt.Errorf("is %d bytes, over the limit of %s: %w", len(*c), units.FormatSize(o.opts.Limits.MaxWriteBytes), errdefs.ErrTooLarge)})
		}
	}
	if err := errors.Join(errs...); err != nil {
		return service.Document{}, err
	}

	id := document.NewID()
	p := task.DocumentIngested{DocumentID: id, Title: title, SourceType: st, Metadata: meta}
	typ := task.EventDocumentIngested
	if c := req.Content; c != nil {
		typ = task.EventNoteCreated
		p.Name = document.Slug(title, 80) + ".md"
		p.File = document.FileName(id, p.Name)
		p.ContentType = "text/markdown; charset=utf-8"
		p.Size = int64(len(*c))
		sum := sha256.Sum256([]byte(*c))
		p.SHA256 = hex.EncodeToString(sum[:])
		if err := workspace.WriteFileAtomic(o.data.Root(), workspace.DirDocuments+"/"+p.File, []byte(*c), 0o644); err != nil {
			return service.Document{}, fmt.Errorf("write note %s: %w", id, err)
		}
	} else {
		_, root, rel, source, err := o.resolveSource(ctx, req.SourcePath)
		if err != nil {
			return service.Document{}, &errdefs.FieldError{Field: "source_path", Err: err}
		}
		defer root.Close()
		p.Name, p.Source = path.Base(rel), source
		p.File = document.FileName(id, p.Name)
		if p.Size, err = workspace.CopyFile(root, rel, o.data.Root(), workspace.DirDocuments+"/"+p.File, maxDocumentBytes); err != nil {
			return service.Document{}, &errdefs.FieldError{Field: "source_path", Err: err}
		}
		if p.SHA256, p.ContentType, err = o.hashDocument(p.File, p.Name); err != nil {
			o.removeDocumentFile(p.File)
			return service.Document{}, err
		}
	}
	data, _ := json.Marshal(p)
	if _, err := o.store.Append(ctx, task.DocumentStreamID(id), 0, eventstore.Proposed{
		Type: typ, SchemaVersion: task.SchemaVersion, Data: data, Actor: service.ActorFrom(ctx),
	}); err != nil {
		o.removeDocumentFile(p.File)
		return service.Document{}, fmt.Errorf("record document %s: %w", id, err)
	}
	o.log.Info("document ingested", "document_id", id, "source_type", st, "size", p.Size, "source", p.Source, "actor", service.ActorFrom(ctx))
	if err := ix.Sync(ctx); err != nil {
		// The document is recorded; the next Sync indexes it.
		o.log.Warn("document index behind", "document_id", id, "err", err)
		return service.Document{DocumentIngested: p, IndexNote: "recorded; indexing is pending"}, nil
	}
	return ix.Get(ctx, id)
}

// checkMetadata accepts a JSON object of at most maxMetadataBytes.
func checkMetadata(raw json.RawMessage) (json.RawMessage, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if len(raw) > maxMetadataBytes {
		return nil, errdefs.Field("metadata", fmt.Sprintf("is %d bytes, over the limit of %d", len(raw), maxMetadataBytes))
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, errdefs.Field("metadata", "must be a JSON object")
	}
	out, _ := json.Marshal(m) // compact, keys sorted
	return out, nil
}

// hashDocument returns the sha256 and content type of a file in documents/.
func (o *Library) hashDocument(file, name string) (string, string, error) {
	f, _, err := workspace.OpenFile(o.data.Root(), workspace.DirDocuments+"/"+file)
	if err != nil {
		return "", "", fmt.Errorf("read document %s: %w", file, err)
	}
	defer f.Close()
	var head [512]byte
	n, _ := io.ReadFull(f, head[:])
	h := sha256.New()
	h.Write(head[:n])
	if _, err := io.Copy(h, f); err != nil {
		return "", "", fmt.Errorf("read document %s: %w", file, err)
	}
	return hex.EncodeToString(h.Sum(nil)), document.ContentType(name, head[:n]), nil
}

func (o *Library) removeDocumentFile(file string) {
	if err := o.data.Root().Remove(workspace.DirDocuments + "/" + file); err != nil {
		o.log.Warn("cannot remove document file", "file", file, "err", err)
	}
}

// SearchDocuments searches the index, best match first.
func (o *Library) SearchDocuments(ctx context.Context, req service.SearchRequest) (service.SearchResult, error) {
	ix, err := o.documents()
	if err != nil {
		return service.SearchResult{}, err
	}
	if len(req.Query) > maxQueryBytes {
		return service.SearchResult{}, errdefs.Field("q", fmt.Sprintf("is over %d bytes", maxQueryBytes))
	}
	hits, err := ix.Search(ctx, document.Query{Text: req.Query, Kind: req.Type, Limit: req.Limit})
	if err != nil {
		return service.SearchResult{}, err
	}
	return service.SearchResult{Query: req.Query, Documents: hits}, nil
}

// ExportNotes writes the notes matching req.Query as Markdown files with
// YAML frontmatter under shared/<destination_dir>/, one per note, named
// after its title. A file of that name there is replaced: an export is
// regenerated content. Nothing is written when no note matches.
func (o *Library) ExportNotes(ctx context.Context, req service.ExportNotesRequest) (service.ExportNotesResult, error) {
	ix, err := o.documents()
	if err != nil {
		return service.ExportNotesResult{}, err
	}
	var errs []error
	if strings.TrimSpace(req.Query) == "" {
		errs = append(errs, errdefs.Field("query", "is required"))
	} else if len(req.Query) > maxQueryBytes {
		errs = append(errs, errdefs.Field("query", fmt.Sprintf("is over %d bytes", maxQueryBytes)))
	}
	dest, err := workspace.Clean(req.DestinationDir)
	switch {
	case err != nil:
		errs = append(errs, &errdefs.FieldError{Field: "destination_dir", Err: err})
	case dest == ".":
		errs = append(errs, errdefs.Field("destination_dir", "must name a directory under shared/, e.g. context/project-notes"))
	}
	max := req.MaxNotes
	if max == 0 {
		max = defaultExportMax
	}
	if max < 1 || max > document.MaxLimit {
		errs = append(errs, errdefs.Field("max_notes", fmt.Sprintf("must be between 1 and %d", document.MaxLimit)))
	}
	if err := errors.Join(errs...); err != nil {
		return service.ExportNotesResult{}, err
	}
	hits, err := ix.Search(ctx, document.Query{Text: req.Query, Kind: document.KindNote, Limit: max})
	if err != nil {
		return service.ExportNotesResult{}, renameField(err, "q", "query")
	}
	files, err := o.renderNotes(hits)
	if err != nil {
		return service.ExportNotesResult{}, err
	}
	var total int64
	for _, f := range files {
		total += int64(len(f.content))
	}
	if err := o.checkSharedQuota(total); err != nil {
		return service.ExportNotesResult{}, err
	}
	res := service.ExportNotesResult{DestinationDir: dest, Notes: []service.ExportedNote{}}
	for _, f := range files {
		p := dest + "/" + f.name
		if err := workspace.WriteFileAtomic(o.data.Shared(), p, f.content, 0o644); err != nil {
			return res, &errdefs.FieldError{Field: "destination_dir", Err: err}
		}
		res.Notes = append(res.Notes, service.ExportedNote{DocumentID: f.doc.DocumentID, Title: f.doc.Title, Path: p, Size: int64(len(f.content))})
	}
	res.Exported, res.Path = len(res.Notes), dest+"/"
	o.log.Info("notes exported", "count", len(res.Notes), "destination", dest, "actor", service.ActorFrom(ctx))
	return res, nil
}

// noteFile is a note rendered as a Markdown file.
type noteFile struct {
	doc     service.Document
	name    string // <slug>.md, unique among the set
	content []byte
}

// renderNotes renders notes as Markdown with frontmatter, each named after
// its title ("-2", "-3" for titles that repeat).
func (o *Library) renderNotes(hits []service.DocumentHit) ([]noteFile, error) {
	taken := map[string]bool{}
	var out []noteFile
	for _, h := range hits {
		body, _, err := workspace.ReadFile(o.data.Root(), workspace.DirDocuments+"/"+h.File, document.MaxIndexedText)
		if err != nil {
			return nil, fmt.Errorf("read note %s: %w", h.DocumentID, err)
		}
		name := uniqueName(document.Slug(h.Title, 80)+".md", taken)
		taken[name] = true
		out = append(out, noteFile{doc: h.Doc, name: name, content: document.Markdown(h.Doc, body)})
	}
	return out, nil
}

// renameField renames a FieldError's field, for an error of the index
// reported under the caller's argument name.
func renameField(err error, from, to string) error {
	var fe *errdefs.FieldError
	if errors.As(err, &fe) && fe.Field == from {
		return &errdefs.FieldError{Field: to, Err: fe.Err}
	}
	return err
}

// TaskDocuments is what spawn_worker's document_ids and note_query bring
// into a task.
type TaskDocuments struct {
	docs      []service.Document
	noteQuery string
	notes     []service.DocumentHit
}

// CheckDocuments validates document_ids and note_query and finds what they
// name. It returns every problem at once.
func (o *Library) CheckDocuments(ctx context.Context, ids []string, noteQuery string) (TaskDocuments, []error) {
	td := TaskDocuments{noteQuery: noteQuery}
	if len(ids) == 0 && noteQuery == "" {
		return td, nil
	}
	ix, err := o.documents()
	if err != nil {
		return td, []error{err}
	}
	var errs []error
	if len(ids) > maxDocumentIDs {
		return td, []error{errdefs.Field("document_ids", fmt.Sprintf("has %d ids, over the limit of %d", len(ids), maxDocumentIDs))}
	}
	seen := map[string]bool{}
	for i, id := range ids {
		field := fmt.Sprintf("document_ids[%d]", i)
		if err := document.CheckID(field, id); err != nil {
			errs = append(errs, err)
			continue
		}
		if seen[id] {
			errs = append(errs, errdefs.Field(field, fmt.Sprintf("%s is listed twice", id)))
			continue
		}
		seen[id] = true
		d, err := ix.Get(ctx, id)
		if err != nil {
			errs = append(errs, &errdefs.FieldError{Field: field, Err: err})
			continue
		}
		td.docs = append(td.docs, d)
	}
	if noteQuery != "" {
		if len(noteQuery) > maxQueryBytes {
			errs = append(errs, errdefs.Field("note_query", fmt.Sprintf("is over %d bytes", maxQueryBytes)))
		} else if td.notes, err = ix.Search(ctx, document.Query{Text: noteQuery, Kind: document.KindNote, Limit: maxNotesInContext}); err != nil {
			errs = append(errs, renameField(err, "q", "note_query"))
		}
	}
	return td, errs
}

// CopyDocuments copies the documents into context/ under their names in
// documents/ (<id>_<name>, so they never collide with other context files)
// and writes the notes to context/notes/, within what is left of the
// context limit. It returns them as prompt.md lists them. Nothing is
// synced: the caller makes the task's directory durable
// (workspace.SyncTreeLater).
func (o *Library) CopyDocuments(dir *os.Root, td TaskDocuments) (docs, notes []ContextFile, err error) {
	if len(td.docs) == 0 && len(td.notes) == 0 {
		return nil, nil, nil
	}
	budget := o.ContextLeft(dir)
	for i, d := range td.docs {
		n, err := workspace.CopyFileNoSync(o.data.Root(), workspace.DirDocuments+"/"+d.File, dir, "context/"+d.File, budget)
		if err != nil {
			if errors.Is(err, errdefs.ErrTooLarge) {
				err = fmt.Errorf("%s does not fit in what is left of the context limit: %w", d.DocumentID, errdefs.ErrTooLarge)
			}
			return nil, nil, &errdefs.FieldError{Field: fmt.Sprintf("document_ids[%d]", i), Err: err}
		}
		budget -= n
		docs = append(docs, ContextFile{Name: d.File, About: fmt.Sprintf("%s (%s)", clip.Line(d.Title, 120), d.ContentType)})
	}
	files, err := o.renderNotes(td.notes)
	if err != nil {
		return nil, nil, err
	}
	for _, f := range files {
		if int64(len(f.content)) > budget {
			return nil, nil, &errdefs.FieldError{Field: "note_query", Err: fmt.Errorf("the notes found do not fit in what is left of the context limit: %w", errdefs.ErrTooLarge)}
		}
		if err := workspace.WriteFileAtomicNoSync(dir, "context/notes/"+f.name, f.content, 0o644); err != nil {
			return nil, nil, fmt.Errorf("write note %s: %w", f.doc.DocumentID, err)
		}
		budget -= int64(len(f.content))
		notes = append(notes, ContextFile{Name: f.name, About: clip.Line(f.doc.Title, 120)})
	}
	return docs, notes, nil
}

// SpecWithDocuments records in spec what document_ids and note_query brought.
func SpecWithDocuments(spec *task.Spec, ids []string, noteQuery string, td TaskDocuments) {
	spec.DocumentIDs, spec.NoteQuery = ids, noteQuery
	for _, n := range td.notes {
		spec.NoteIDs = append(spec.NoteIDs, n.DocumentID)
	}
}
