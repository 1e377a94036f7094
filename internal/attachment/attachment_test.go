package attachment

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

func MustStore(tb testing.TB, opts Options) (*Store, string) {
	tb.Helper()
	dir := tb.TempDir()
	root, err := os.OpenRoot(dir)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { root.Close() })
	return New(root, opts), dir
}

func TestCreateGetOpen(t *testing.T) {
	at := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	s, dir := MustStore(t, Options{MaxFileBytes: 1 << 20, Now: func() time.Time { return at }})
	content := "date,amount\n2025-01-02,-12.50\n"
	m, err := s.Create("../statements/bank.CSV", strings.NewReader(content), "march", "upload")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(content))
	if m.Name != "bank.CSV" || m.Size != int64(len(content)) || m.SHA256 != hex.EncodeToString(sum[:]) || !m.CreatedAt.Equal(at) || m.Type != "text/csv; charset=utf-8" {
		t.Errorf("meta %+v", m)
	}
	if want := m.ID[:2] + "/" + m.ID + ".csv"; m.File != want {
		t.Errorf("file %s, want %s", m.File, want)
	}
	if _, err := os.Stat(filepath.Join(dir, m.ID[:2], m.ID+".meta.json")); err != nil {
		t.Errorf("metadata file: %v", err)
	}
	got, f, err := s.Open(m.ID)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != content || got != m {
		t.Errorf("open: %+v %q", got, b)
	}
}

func TestSniffedTypeWinsOverAMisleadingName(t *testing.T) {
	s, _ := MustStore(t, Options{})
	png := "\x89PNG\r\n\x1a\n" + strings.Repeat("\x00", 32)
	m, err := s.Create("chart.txt", strings.NewReader(png), "", "upload")
	if err != nil {
		t.Fatal(err)
	}
	if m.Type != "image/png" {
		t.Errorf("type %q, want image/png", m.Type)
	}
}

func TestRefusalsLeaveNothing(t *testing.T) {
	s, dir := MustStore(t, Options{MaxFileBytes: 10})
	for _, c := range []struct {
		name, content string
		class         error
	}{
		{"big.bin", strings.Repeat("x", 11), errdefs.ErrTooLarge},
		{"empty.txt", "", errdefs.ErrInvalidArgument},
		{"..", "x", errdefs.ErrInvalidArgument},
		{"bad\x00name", "x", errdefs.ErrInvalidArgument},
		{"next\u0085line.txt", "x", errdefs.ErrInvalidArgument}, // C1 control
		{"csi\u009b31m.txt", "x", errdefs.ErrInvalidArgument},
	} {
		if _, err := s.Create(c.name, strings.NewReader(c.content), "", "upload"); !errors.Is(err, c.class) {
			t.Errorf("%q: %v, want %v", c.name, err, c.class)
		}
	}
	var files []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, p)
		}
		return nil
	})
	if len(files) != 0 {
		t.Errorf("files left: %v", files)
	}
	// Exactly at the limit is fine.
	if _, err := s.Create("ten.bin", strings.NewReader(strings.Repeat("x", 10)), "", "upload"); err != nil {
		t.Errorf("10 bytes with a limit of 10: %v", err)
	}
}

func TestUnknownAndMalformedIDs(t *testing.T) {
	s, _ := MustStore(t, Options{})
	if _, err := s.Get(strings.Repeat("a", 32)); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("unknown: %v", err)
	}
	for _, id := range []string{"", "../../etc/passwd", strings.Repeat("A", 32), strings.Repeat("a", 33)} {
		if _, err := s.Get(id); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q: %v, want invalid argument", id, err)
		}
	}
}

func TestAbortAndRemoveAndOrphans(t *testing.T) {
	now := time.Now()
	s, dir := MustStore(t, Options{Now: func() time.Time { return now }})
	st, err := s.Stage("a.txt", strings.NewReader("hello"), "", "upload")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(st.Meta().ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a staged attachment is visible: %v", err)
	}
	st.Abort()
	m, err := s.Create("b.txt", strings.NewReader("hello"), "", "upload")
	if err != nil {
		t.Fatal(err)
	}
	list, err := s.List()
	if err != nil || len(list) != 1 || list[0].ID != m.ID {
		t.Errorf("list %v %v, want only %s", list, err, m.ID)
	}
	// Content without metadata is an orphan once old enough.
	os.Remove(filepath.Join(dir, m.ID[:2], m.ID+".meta.json"))
	if o, _ := s.Orphans(now.Add(-time.Hour)); len(o) != 0 {
		t.Errorf("a fresh file is an orphan: %v", o)
	}
	if o, _ := s.Orphans(now.Add(time.Hour)); len(o) != 1 || o[0] != m.File {
		t.Errorf("orphans %v, want [%s]", o, m.File)
	}
	m2, _ := s.Create("c.txt", strings.NewReader("x"), "", "upload")
	if err := s.Remove(m2.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, m2.File)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("content left after Remove: %v", err)
	}
	if err := s.Remove(m2.ID); err != nil {
		t.Errorf("second Remove: %v", err)
	}
}

// A .json upload keeps its content: its metadata has a name of its own.
func TestJSONUploadKeepsItsContent(t *testing.T) {
	root, err := os.OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	s := New(root, Options{})
	const content = `{"amount": 12.5, "category": "food"}`
	m, err := s.Create("expenses.json", strings.NewReader(content), "", "upload")
	if err != nil {
		t.Fatal(err)
	}
	_, f, err := s.Open(m.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if b, _ := io.ReadAll(f); string(b) != content {
		t.Errorf("a .json upload reads back as %q, want %q", b, content)
	}
}

// Migrate moves metadata from <id>.json to <id>.meta.json, keeps every
// attachment whose content survived, and reports (and keeps explaining)
// a .json attachment whose content its metadata overwrote.
func TestMigrateLegacyMetadata(t *testing.T) {
	dir := t.TempDir()
	legacy := func(id, ext string, content []byte) Meta {
		m := Meta{ID: id, Name: "x." + ext, Size: 3, File: id[:2] + "/" + id + "." + ext}
		if err := os.MkdirAll(filepath.Join(dir, id[:2]), 0o755); err != nil {
			t.Fatal(err)
		}
		if content != nil {
			if err := os.WriteFile(filepath.Join(dir, m.File), content, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		b, _ := json.Marshal(m)
		// The old layout: metadata at <id>.json, over a .json content.
		if err := os.WriteFile(filepath.Join(dir, id[:2], id+".json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
		return m
	}
	png := legacy("aa000000000000000000000000000001", "png", []byte("png"))
	js := legacy("bb000000000000000000000000000002", "json", nil)
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	s := New(root, Options{})
	for round := range 2 { // idempotent
		lost, err := s.Migrate()
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{js.ID}; round == 0 && !slices.Equal(lost, want) || round == 1 && len(lost) != 0 {
			t.Errorf("round %d: lost %v", round, lost)
		}
	}
	_, f, err := s.Open(png.ID)
	if err != nil {
		t.Fatalf("the png after migration: %v", err)
	}
	b, _ := io.ReadAll(f)
	f.Close()
	if string(b) != "png" {
		t.Errorf("png content %q", b)
	}
	if _, _, err := s.Open(js.ID); err == nil || !strings.Contains(err.Error(), "overwritten by its own metadata") {
		t.Errorf("the lost .json attachment: %v, want an error saying what happened", err)
	}
	if list, _ := s.List(); len(list) != 2 {
		t.Errorf("list after migration: %v", list)
	}
	// A .json upload made after the migration is content, not metadata.
	m, err := s.Create("new.json", strings.NewReader(`{"attachment_id": "x"}`), "", "upload")
	if err != nil {
		t.Fatal(err)
	}
	if lost, err := s.Migrate(); err != nil || len(lost) != 0 {
		t.Errorf("Migrate over a new .json upload: %v %v", lost, err)
	}
	if _, f, err := s.Open(m.ID); err != nil {
		t.Errorf("the new .json upload after another Migrate: %v", err)
	} else {
		f.Close()
	}
}

// TestMigrateDashMetadata: metadata at <id>-meta.json (data roots until
// 2026-11-29) moves to <id>.meta.json, SPEC §1's name; the attachment
// reads as before, and a second Migrate changes nothing.
func TestMigrateDashMetadata(t *testing.T) {
	dir := t.TempDir()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	s := New(root, Options{})
	m, err := s.Create("report.pdf", strings.NewReader("%PDF-1.4 x"), "", "upload")
	if err != nil {
		t.Fatal(err)
	}
	now := filepath.Join(dir, m.ID[:2], m.ID+".meta.json")
	dash := filepath.Join(dir, m.ID[:2], m.ID+"-meta.json")
	if err := os.Rename(now, dash); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if lost, err := s.Migrate(); err != nil || len(lost) != 0 {
			t.Fatalf("Migrate: %v %v", lost, err)
		}
	}
	if _, err := os.Stat(now); err != nil {
		t.Errorf("no %s after Migrate: %v", filepath.Base(now), err)
	}
	if _, err := os.Stat(dash); err == nil {
		t.Errorf("%s is still there", filepath.Base(dash))
	}
	got, f, err := s.Open(m.ID)
	if err != nil || got.Name != "report.pdf" {
		t.Fatalf("Open after Migrate: %+v %v", got, err)
	}
	f.Close()
}
