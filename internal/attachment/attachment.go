// Package attachment stores files that enter or leave Corral as attachments
// (SPEC §1): each is attachments/XX/<id>.<ext> with its metadata beside it
// in attachments/XX/<id>.meta.json (name, MIME type, size, sha256,
// created_at), where XX is the first two characters of the id: a name no
// content file can take, whatever its extension. Ids are random, so the
// shards fill evenly. Data roots from before keep their metadata in
// <id>-meta.json, or in <id>.json, which a .json upload's content
// overwrote; Migrate moves it.
//
// Content is streamed: a file is written to a temporary file in its shard
// while its sha256 and size are computed and its first 512 bytes sniffed,
// so memory stays constant whatever the size. A file becomes visible only
// when its metadata file is renamed into place (Commit); a temporary or a
// content file without metadata is garbage that Sweep removes.
//
// Every operation goes through an *os.Root on the attachments directory.
// A Store is safe for concurrent use.
package attachment

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"os"
	"path"
	"sort"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/filetype"
	"github.com/corral-dev/corral/internal/units"
	"github.com/corral-dev/corral/internal/workspace"
)

// Meta is an attachment's metadata, as stored in its .meta.json file.
type Meta struct {
	ID          string    `json:"attachment_id"`
	Name        string    `json:"name"` // the original file name, as given
	Type        string    `json:"type"` // MIME type, sniffed from the content
	Size        int64     `json:"size"`
	SHA256      string    `json:"sha256"`
	CreatedAt   time.Time `json:"created_at"`
	Description string    `json:"description,omitempty"`
	// Source says where the content came from: "upload", or the data-root
	// path of the workspace file it was made from.
	Source string `json:"source,omitempty"`
	// File is the content's path relative to attachments/ ("ab/ab12….png").
	File string `json:"file"`
}

// Options bound a Store.
type Options struct {
	// MaxFileBytes bounds one attachment's content; 0 means no limit.
	MaxFileBytes int64
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Store is the attachments directory.
type Store struct {
	root *os.Root
	opts Options
	mu   sync.Mutex // serialises Remove with itself
}

// ErrEmpty is returned for content of zero bytes.
var ErrEmpty = fmt.Errorf("file is empty: %w", errdefs.ErrInvalidArgument)

// New returns a Store over root, the attachments directory.
func New(root *os.Root, opts Options) *Store {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Store{root: root, opts: opts}
}

// MaxFileBytes returns the per-file limit (0 for none).
func (s *Store) MaxFileBytes() int64 { return s.opts.MaxFileBytes }

// ValidID reports whether id is well formed: 32 lowercase hex digits.
func ValidID(id string) bool {
	if len(id) != 32 {
		return false
	}
	for _, c := range []byte(id) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// CheckID returns an ErrInvalidArgument naming field if id is malformed.
func CheckID(field, id string) error {
	if !ValidID(id) {
		if len(id) > 64 {
			id = id[:64] + "…"
		}
		return errdefs.Field(field, fmt.Sprintf("%q is not an attachment id (want 32 lowercase hex digits)", id))
	}
	return nil
}

func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// maxName bounds an original file name.
const maxName = 255

// CleanName returns the base name of a caller's file name, checked: UTF-8,
// no NUL or control characters, not "." or "..", at most 255 bytes. The
// name is kept for Content-Disposition and the file's name in a task's
// context/; it never becomes a path on the server.
func CleanName(name string) (string, error) {
	name = strings.ReplaceAll(name, "\\", "/")
	name = path.Base(strings.TrimRight(name, "/"))
	switch {
	case name == "" || name == "." || name == ".." || name == "/":
		return "", fmt.Errorf("file name is missing: %w", errdefs.ErrInvalidArgument)
	case !utf8.ValidString(name) || strings.ContainsFunc(name, unicode.IsControl):
		return "", fmt.Errorf("file name %q must be UTF-8 without control characters: %w", name, errdefs.ErrInvalidArgument)
	case len(name) > maxName:
		return "", fmt.Errorf("file name is %d bytes, over the limit of %d: %w", len(name), maxName, errdefs.ErrInvalidArgument)
	case workspace.Reserved(name):
		return "", fmt.Errorf("file name %q is reserved on Windows (CON, PRN, AUX, NUL, COM1-9, LPT1-9): %w", name, errdefs.ErrInvalidArgument)
	}
	return name, nil
}

// plainExt reports whether e (without the dot) is 1 to 16 lowercase
// letters or digits, safe as a stored file's extension.
func plainExt(e string) bool {
	if len(e) < 1 || len(e) > 16 {
		return false
	}
	for _, c := range []byte(e) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'z') {
			return false
		}
	}
	return true
}

// ext picks the stored file's extension: the original name's, if plain,
// else one for the sniffed type, else "bin".
func ext(name, typ string) string {
	e := strings.ToLower(strings.TrimPrefix(path.Ext(name), "."))
	if plainExt(e) {
		return e
	}
	if exts, _ := mime.ExtensionsByType(typ); len(exts) > 0 {
		if e := strings.TrimPrefix(exts[0], "."); plainExt(e) {
			return e
		}
	}
	return "bin"
}

// Staged is an attachment whose content is written but not yet visible.
// Commit makes it visible; Abort removes it. Exactly one of them must be
// called.
type Staged struct {
	s    *Store
	meta Meta
	tmp  string
}

// Meta returns the staged attachment's metadata.
func (st *Staged) Meta() Meta { return st.meta }

// Stage streams r into the store under a new id, computing its size,
// sha256 and type. It fails with ErrEmpty for no content and with
// errdefs.ErrTooLarge past the per-file limit; nothing is left behind on
// failure.
func (s *Store) Stage(name string, r io.Reader, description, source string) (*Staged, error) {
	name, err := CleanName(name)
	if err != nil {
		return nil, err
	}
	id := newID()
	shard := id[:2]
	if err := s.root.MkdirAll(shard, 0o755); err != nil {
		return nil, fmt.Errorf("create attachment shard %s: %w", shard, err)
	}
	tmp := path.Join(shard, "."+id+".tmp")
	f, err := s.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create attachment file: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			f.Close()
			s.root.Remove(tmp)
		}
	}()
	h := sha256.New()
	sn := &sniffer{}
	src := r
	max := s.opts.MaxFileBytes
	if max > 0 {
		src = io.LimitReader(r, max+1)
	}
	// 256 KiB buffer: large enough that a 1 GiB upload is 4096 writes,
	// small enough that many concurrent uploads stay cheap.
	n, err := io.CopyBuffer(io.MultiWriter(f, h, sn), src, make([]byte, 256<<10))
	if err != nil {
		return nil, fmt.Errorf("write attachment %q: %w", name, err)
	}
	if max > 0 && n > max {
		return nil, fmt.Errorf("file %q is over the per-file limit of %s: %w", name, units.FormatSize(max), errdefs.ErrTooLarge)
	}
	if n == 0 {
		return nil, fmt.Errorf("%q: %w", name, ErrEmpty)
	}
	if err := f.Sync(); err != nil {
		return nil, fmt.Errorf("sync attachment %q: %w", name, err)
	}
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("close attachment %q: %w", name, err)
	}
	typ := sn.typ(name)
	ok = true
	return &Staged{s: s, tmp: tmp, meta: Meta{
		ID: id, Name: name, Type: typ, Size: n, SHA256: hex.EncodeToString(h.Sum(nil)),
		CreatedAt: s.opts.Now().UTC(), Description: description, Source: source,
		File: path.Join(shard, id+"."+ext(name, typ)),
	}}, nil
}

// Commit renames the content into place and writes the metadata file,
// which makes the attachment visible.
func (st *Staged) Commit() error {
	s := st.s
	if err := s.root.Rename(st.tmp, st.meta.File); err != nil {
		st.Abort()
		return fmt.Errorf("store attachment %s: %w", st.meta.ID, err)
	}
	b, _ := json.MarshalIndent(st.meta, "", "  ")
	if err := writeAtomic(s.root, metaPath(st.meta.ID), b); err != nil {
		s.root.Remove(st.meta.File)
		return fmt.Errorf("store attachment %s metadata: %w", st.meta.ID, err)
	}
	return nil
}

// Abort removes a staged attachment's content.
func (st *Staged) Abort() {
	st.s.root.Remove(st.tmp)
	st.s.root.Remove(st.meta.File)
}

// Create stages and commits r in one step.
func (s *Store) Create(name string, r io.Reader, description, source string) (Meta, error) {
	st, err := s.Stage(name, r, description, source)
	if err != nil {
		return Meta{}, err
	}
	if err := st.Commit(); err != nil {
		return Meta{}, err
	}
	return st.meta, nil
}

// metaSuffix ends a metadata file's name: <id>.meta.json (SPEC §1). A
// content file is <id>.<ext>, its extension letters and digits alone, so
// no upload can take it.
const metaSuffix = ".meta.json"

func metaPath(id string) string { return path.Join(id[:2], id+metaSuffix) }

// legacyMetaPath is where data roots before 2026-11 kept metadata;
// dashMetaSuffix, where they kept it until 2026-11-29.
func legacyMetaPath(id string) string { return path.Join(id[:2], id+".json") }

const dashMetaSuffix = "-meta.json"

// Migrate moves the metadata of a data root from before metaSuffix to
// <id>.meta.json: from <id>-meta.json (renamed), and from <id>.json. It
// is idempotent and safe to repeat after a crash (the new file is written
// before the old one is removed). It returns the ids
// of attachments whose content was already lost: a .json upload's
// content and metadata shared one path, and the metadata overwrote it.
// Their metadata is kept, so Open says what happened instead of not
// knowing the id.
func (s *Store) Migrate() (lost []string, err error) {
	shards, err := fs.ReadDir(s.root.FS(), ".")
	if err != nil {
		return nil, fmt.Errorf("migrate attachments: %w", err)
	}
	for _, sh := range shards {
		if !sh.IsDir() {
			continue
		}
		ents, err := fs.ReadDir(s.root.FS(), sh.Name())
		if err != nil {
			return lost, fmt.Errorf("migrate attachments: %w", err)
		}
		for _, e := range ents {
			if id, ok := strings.CutSuffix(e.Name(), dashMetaSuffix); ok && ValidID(id) && id[:2] == sh.Name() {
				if err := s.root.Rename(path.Join(sh.Name(), e.Name()), metaPath(id)); err != nil {
					return lost, fmt.Errorf("migrate attachment %s: %w", id, err)
				}
				continue
			}
			id, ok := strings.CutSuffix(e.Name(), ".json")
			if !ok || !ValidID(id) || id[:2] != sh.Name() {
				continue
			}
			if _, err := s.root.Lstat(metaPath(id)); err == nil {
				continue // migrated: <id>.json is a .json upload's content
			}
			m, err := s.readMeta(legacyMetaPath(id))
			if err != nil || m.ID != id {
				continue // not metadata: content whose metadata is gone
			}
			b, _ := json.MarshalIndent(m, "", "  ")
			if err := writeAtomic(s.root, metaPath(id), b); err != nil {
				return lost, fmt.Errorf("migrate attachment %s: %w", id, err)
			}
			if err := s.root.Remove(legacyMetaPath(id)); err != nil {
				return lost, fmt.Errorf("migrate attachment %s: %w", id, err)
			}
			if m.File == legacyMetaPath(id) {
				lost = append(lost, id)
			}
		}
	}
	return lost, nil
}

// readMeta decodes a metadata file.
func (s *Store) readMeta(p string) (Meta, error) {
	f, err := s.root.Open(p)
	if err != nil {
		return Meta{}, err
	}
	defer f.Close()
	var m Meta
	err = json.NewDecoder(io.LimitReader(f, 64<<10)).Decode(&m)
	return m, err
}

// Get returns an attachment's metadata, or an error of class
// errdefs.ErrNotFound.
func (s *Store) Get(id string) (Meta, error) {
	if !ValidID(id) {
		return Meta{}, CheckID("attachment_id", id)
	}
	m, err := s.readMeta(metaPath(id))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Meta{}, fmt.Errorf("attachment %s: %w", id, errdefs.ErrNotFound)
	case err != nil:
		return Meta{}, fmt.Errorf("read attachment %s metadata: %w", id, err)
	}
	if m.ID != id || path.Dir(m.File) != id[:2] || !strings.HasPrefix(path.Base(m.File), id+".") {
		return Meta{}, fmt.Errorf("attachment %s metadata names another file: %w", id, errdefs.ErrFailedPrecondition)
	}
	return m, nil
}

// Open returns an attachment's metadata and its content, open for reading.
// The caller closes the file.
func (s *Store) Open(id string) (Meta, *os.File, error) {
	m, err := s.Get(id)
	if err != nil {
		return Meta{}, nil, err
	}
	f, err := s.root.Open(m.File)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) && m.File == legacyMetaPath(id) {
			return Meta{}, nil, fmt.Errorf("attachment %s (%s): its content was overwritten by its own metadata, a fault of Corral before 2026-11 with .json files; upload it again: %w", id, m.Name, errdefs.ErrNotFound)
		}
		if errors.Is(err, fs.ErrNotExist) {
			return Meta{}, nil, fmt.Errorf("attachment %s content: %w", id, errdefs.ErrNotFound)
		}
		return Meta{}, nil, fmt.Errorf("open attachment %s: %w", id, err)
	}
	return m, f, nil
}

// Root returns the attachments directory's root, for copying content.
func (s *Store) Root() *os.Root { return s.root }

// List returns every committed attachment, oldest first. Unreadable
// metadata files are skipped.
func (s *Store) List() ([]Meta, error) {
	var out []Meta
	err := fs.WalkDir(s.root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == "." {
				return err
			}
			return nil
		}
		if d.IsDir() {
			if p != "." && strings.Count(p, "/") > 0 {
				return fs.SkipDir
			}
			return nil
		}
		id, ok := strings.CutSuffix(path.Base(p), metaSuffix)
		if !ok || !ValidID(id) {
			return nil
		}
		if m, err := s.Get(id); err == nil {
			out = append(out, m)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list attachments: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

// Remove deletes an attachment: its metadata first, so a partial removal
// leaves content without metadata (invisible, and swept later), never
// metadata without content. Removing an unknown id returns nil.
func (s *Store) Remove(id string) error {
	if !ValidID(id) {
		return CheckID("attachment_id", id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := s.Get(id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := s.root.Remove(metaPath(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove attachment %s metadata: %w", id, err)
	}
	if err := s.root.Remove(m.File); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove attachment %s content: %w", id, err)
	}
	return nil
}

// Orphans returns content and temporary files that have no metadata and
// were last modified before cutoff: what a crash or a failed removal left.
func (s *Store) Orphans(cutoff time.Time) ([]string, error) {
	var out []string
	err := fs.WalkDir(s.root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == "." {
			return nil
		}
		if d.IsDir() {
			if strings.Contains(p, "/") {
				return fs.SkipDir
			}
			return nil
		}
		base := path.Base(p)
		if strings.HasSuffix(base, metaSuffix) && !strings.HasPrefix(base, ".") {
			return nil
		}
		id := strings.TrimPrefix(base, ".")
		if i := strings.IndexByte(id, '.'); i >= 0 {
			id = id[:i]
		}
		if ValidID(id) && !strings.HasPrefix(base, ".") {
			if _, err := s.root.Stat(metaPath(id)); err == nil {
				return nil
			}
		}
		info, err := d.Info()
		if err != nil || !info.ModTime().Before(cutoff) {
			return nil
		}
		out = append(out, p)
		return nil
	})
	return out, err
}

// RemoveFile removes one file beneath the attachments directory (an orphan
// from Orphans).
func (s *Store) RemoveFile(p string) error {
	if err := s.root.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}

// sniffer keeps the first 512 bytes written to it, for type detection.
type sniffer struct {
	buf []byte
}

func (s *sniffer) Write(p []byte) (int, error) {
	if n := filetype.HeadBytes - len(s.buf); n > 0 {
		s.buf = append(s.buf, p[:min(n, len(p))]...)
	}
	return len(p), nil
}

// typ returns the content's MIME type (package filetype).
func (s *sniffer) typ(name string) string { return filetype.Detect(name, s.buf) }

func writeAtomic(root *os.Root, name string, data []byte) error {
	tmp := path.Join(path.Dir(name), "."+path.Base(name)+".tmp")
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		root.Remove(tmp)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		root.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		root.Remove(tmp)
		return err
	}
	if err := root.Rename(tmp, name); err != nil {
		root.Remove(tmp)
		return err
	}
	return nil
}
