package workspace

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// MustOpenRoot makes a directory with files (name → content; a name ending
// in "/" is a directory) and returns an os.Root on it and its path.
func MustOpenRoot(tb testing.TB, files map[string]string) (*os.Root, string) {
	tb.Helper()
	dir := tb.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if strings.HasSuffix(name, "/") {
			if err := os.MkdirAll(p, 0o755); err != nil {
				tb.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	r, err := os.OpenRoot(dir)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.Close() })
	return r, dir
}

// MustSymlink makes a symbolic link at link (relative to dir) to target.
func MustSymlink(tb testing.TB, dir, link, target string) {
	tb.Helper()
	if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
		tb.Fatal(err)
	}
}

// mustOutside returns a directory outside any root, holding secret.txt.
func mustOutside(tb testing.TB) string {
	tb.Helper()
	out := tb.TempDir()
	if err := os.WriteFile(filepath.Join(out, "secret.txt"), []byte("secret"), 0o644); err != nil {
		tb.Fatal(err)
	}
	return out
}

func TestClean(t *testing.T) {
	const (
		ok      = iota
		escapes // ErrPathEscapes, a permission denied
		invalid // ErrInvalidArgument: absolute, too long
	)
	tests := []struct {
		in   string
		want string
		err  int
	}{
		{"", ".", ok},
		{"/", ".", ok},
		{".", ".", ok},
		{"a.txt", "a.txt", ok},
		{"a/./b//c", "a/b/c", ok},
		{"a/", "a", ok},
		// /workspace/shared/ is how workers name shared files.
		{"/workspace/shared/x", "x", ok},
		{"/workspace/shared", ".", ok},
		{"/workspace/shared/", ".", ok},
		{"/workspace/shared/data/a.csv", "data/a.csv", ok},
		{"/workspace/shared//data/a.csv", "data/a.csv", ok},
		{"workspace/shared/x", "workspace/shared/x", ok},
		// Any other absolute path is refused, not taken as relative.
		{"/abs.txt", "", invalid},
		{"/etc/passwd", "", invalid},
		{"//etc/passwd", "", invalid},
		// A sibling prefix is not stripped: it is absolute.
		{"/workspace/shared-evil/x", "", invalid},
		{"/workspace/sharedx", "", invalid},
		{"..", "", escapes},
		{"../x", "", escapes},
		{"a/../../x", "", escapes},
		{"a/..", "", escapes},
		{"/../etc/passwd", "", escapes},
		{"/workspace/shared/../x", "", escapes},
		{"/workspace/shared/..", "", escapes},
		{"a\x00b", "", escapes},
		{"a\\b", "", escapes},
		{"..\\x", "", escapes},
		{"C:\\x", "", escapes},
		// Lengths: PATH_MAX for the path, NAME_MAX for each name.
		{strings.Repeat("a/", MaxPath/2+1), "", invalid},
		{strings.Repeat("a", 4200), "", invalid},
		{strings.Repeat("a", MaxName+1), "", invalid},
		{"d/" + strings.Repeat("a", MaxName+1) + "/x", "", invalid},
		{strings.Repeat("a", MaxName), strings.Repeat("a", MaxName), ok},
		{strings.Repeat("d/", (MaxPath-5)/2) + "x.txt", strings.Repeat("d/", (MaxPath-5)/2) + "x.txt", ok},
		// Control characters are CheckName's to judge: a read of a
		// worker's file must still work.
		{"a\nb.txt", "a\nb.txt", ok},
	}
	for _, tt := range tests {
		got, err := Clean(tt.in)
		switch tt.err {
		case escapes:
			if !errors.Is(err, ErrPathEscapes) || !errors.Is(err, errdefs.ErrPermissionDenied) {
				t.Errorf("Clean(%.40q) = %.40q, %v; want ErrPathEscapes", tt.in, got, err)
			}
		case invalid:
			if !errors.Is(err, errdefs.ErrInvalidArgument) || errors.Is(err, ErrPathEscapes) {
				t.Errorf("Clean(%.40q) = %.40q, %v; want ErrInvalidArgument", tt.in, got, err)
			}
		default:
			if err != nil || got != tt.want {
				t.Errorf("Clean(%.40q) = %.40q, %v; want %.40q", tt.in, got, err, tt.want)
			}
		}
	}
}

// The errors of Clean say what is wrong in words a caller can act on,
// without echoing all of a long path.
func TestCleanMessages(t *testing.T) {
	for in, want := range map[string]string{
		"/abs.txt":                       `path "/abs.txt" is absolute: absolute paths are not allowed; give a path relative to shared/`,
		strings.Repeat("a", 4200):        "path too long: 4200 bytes, over the limit of 4096",
		"x/" + strings.Repeat("b", 300):  `name too long: "` + strings.Repeat("b", 80) + `…" is 300 bytes, over the limit of 255`,
		"../" + strings.Repeat("c", 200): `path "../` + strings.Repeat("c", 77) + `…" contains ".."`,
	} {
		_, err := Clean(in)
		if err == nil || !strings.HasPrefix(errdefs.Message(err), want) {
			t.Errorf("Clean(%.20q…) = %v, want a message starting %q", in, err, want)
		}
		if err != nil && len(err.Error()) > 300 {
			t.Errorf("Clean(%.20q…): a %d-byte message", in, len(err.Error()))
		}
	}
}

func TestCheckName(t *testing.T) {
	for _, name := range []string{"a.txt", "data/b c.csv", "ünïcödé/日本.md", "emoji-🙂.txt", "-dash", ".hidden"} {
		if err := CheckName(name); err != nil {
			t.Errorf("CheckName(%q) = %v, want nil", name, err)
		}
	}
	for _, name := range []string{
		"a\nb.txt", "a\rb", "tab\there", "esc\x1b[31mred", "bell\a", "del\x7f", "nul\x00",
		"c1-\u0085-nel", "c1-\u009b-csi", "dir\n/x.txt", "bad-utf8-\xff.txt", "cut-\xc3",
	} {
		err := CheckName(name)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("CheckName(%q) = %v, want ErrInvalidArgument", name, err)
		}
	}
	if err := CheckName("a\nb.txt"); err == nil || !strings.Contains(err.Error(), "control character U+000A") {
		t.Errorf("CheckName(a newline) = %v, want it to name U+000A", err)
	}
}

// Every write refuses a name with a control character and creates nothing;
// a copy keeps the name a worker chose for its own file.
func TestWritesRefuseControlCharacters(t *testing.T) {
	r, dir := MustOpenRoot(t, map[string]string{"src/a\nb.txt": "worker's"})
	for _, name := range []string{"a\nb.txt", "sub\u0085dir/x.txt", "x\x1b[2J.txt", "bad\xff.txt"} {
		if err := WriteFileAtomic(r, name, []byte("x"), 0o644); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("WriteFileAtomic(%q) = %v, want ErrInvalidArgument", name, err)
		}
		if err := WriteAtomic(r, name, 0o644, func(io.Writer) error { return nil }); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("WriteAtomic(%q) = %v, want ErrInvalidArgument", name, err)
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != "src" {
		t.Errorf("refused writes left %v", ents)
	}
	if _, err := CopyFile(r, "src/a\nb.txt", r, "dst/a\nb.txt", 100); err != nil {
		t.Errorf("CopyFile of a worker's name: %v", err)
	}
}

// A name the kernel finds too long is a caller's error, not an internal
// one, whichever entry point meets it.
func TestNameTooLongClassified(t *testing.T) {
	r, _ := MustOpenRoot(t, map[string]string{})
	long := strings.Repeat("n", MaxName+1)
	if err := WriteFileAtomic(r, long, []byte("x"), 0o644); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("WriteFileAtomic(%d-byte name) = %v, want ErrInvalidArgument", len(long), err)
	}
	for _, p := range []string{long, strings.Repeat("a", 4200)} {
		if _, _, err := ReadFile(r, p, 10); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ReadFile(%d bytes) = %v, want ErrInvalidArgument", len(p), err)
		}
		if _, err := List(r, p, false); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("List(%d bytes) = %v, want ErrInvalidArgument", len(p), err)
		}
	}
}

// TestRootEnforces checks that os.Root, not only Clean, stops escapes:
// WriteFileAtomic does not call Clean.
func TestRootEnforces(t *testing.T) {
	outside := mustOutside(t)
	r, dir := MustOpenRoot(t, map[string]string{"a/": ""})
	MustSymlink(t, dir, "out", outside)
	for _, name := range []string{"../x", "a/../../x", filepath.Join(outside, "x"), "out/x", "out/new/x"} {
		if err := WriteFileAtomic(r, name, []byte("pwned"), 0o644); !errors.Is(err, ErrPathEscapes) && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("WriteFileAtomic(%q) = %v, want it refused", name, err)
		}
	}
	for _, p := range []string{filepath.Join(filepath.Dir(dir), "x"), filepath.Join(outside, "x"), filepath.Join(outside, "new")} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s exists after refused writes (err %v)", p, err)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 1 {
		t.Errorf("outside directory has %d entries, want only secret.txt", len(ents))
	}
}

func TestSymlinkToOutsideRefused(t *testing.T) {
	outside := mustOutside(t)
	r, dir := MustOpenRoot(t, map[string]string{})
	MustSymlink(t, dir, "abs", filepath.Join(outside, "secret.txt"))
	MustSymlink(t, dir, "rel", "../"+filepath.Base(outside)+"/secret.txt")
	dst, _ := MustOpenRoot(t, map[string]string{})
	for _, name := range []string{"abs", "rel"} {
		if _, _, err := ReadFile(r, name, 100); !errors.Is(err, ErrPathEscapes) {
			t.Errorf("ReadFile(%s) = %v, want ErrPathEscapes", name, err)
		}
		if f, _, err := OpenFile(r, name); !errors.Is(err, ErrPathEscapes) {
			if f != nil {
				f.Close()
			}
			t.Errorf("OpenFile(%s) = %v, want ErrPathEscapes", name, err)
		}
		if _, err := CopyFile(r, name, dst, "copy", 100); !errors.Is(err, ErrPathEscapes) {
			t.Errorf("CopyFile(%s) = %v, want ErrPathEscapes", name, err)
		}
	}
	if _, err := dst.Stat("copy"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused copy left its destination: %v", err)
	}
}

func TestSymlinkInsideRefused(t *testing.T) {
	r, dir := MustOpenRoot(t, map[string]string{"real.txt": "hello", "sub/": ""})
	MustSymlink(t, dir, "link.txt", "real.txt")
	MustSymlink(t, dir, "sublink", "sub")
	if f, _, err := OpenFile(r, "link.txt"); !errors.Is(err, ErrPathEscapes) {
		if f != nil {
			f.Close()
		}
		t.Errorf("OpenFile(link to a file inside) = %v, want ErrPathEscapes", err)
	}
	if _, _, err := ReadFile(r, "link.txt", 100); !errors.Is(err, ErrPathEscapes) {
		t.Errorf("ReadFile(link to a file inside) = %v, want ErrPathEscapes", err)
	}
	if _, _, err := ReadFile(r, "sub", 100); !errors.Is(err, ErrIsDir) {
		t.Errorf("ReadFile(directory) = %v, want ErrIsDir", err)
	}
	if _, _, err := ReadFile(r, "missing", 100); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ReadFile(missing) = %v, want ErrNotFound", err)
	}
	data, _, err := ReadFile(r, "/workspace/shared/real.txt", 100)
	if err != nil || string(data) != "hello" {
		t.Errorf("ReadFile(/workspace/shared/real.txt) = %q, %v; want hello", data, err)
	}
}

func TestWriteUnderSymlinkedParentRefused(t *testing.T) {
	outside := mustOutside(t)
	r, dir := MustOpenRoot(t, map[string]string{})
	MustSymlink(t, dir, "parent", outside)
	if err := WriteFileAtomic(r, "parent/new.txt", []byte("x"), 0o644); !errors.Is(err, ErrPathEscapes) {
		t.Errorf("WriteFileAtomic(parent/new.txt) = %v, want ErrPathEscapes", err)
	}
	ents, err := os.ReadDir(outside)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if diff := cmp.Diff([]string{"secret.txt"}, names); diff != "" {
		t.Errorf("outside directory changed (-want +got):\n%s", diff)
	}
}

func TestListFiles(t *testing.T) {
	outside := mustOutside(t)
	r, dir := MustOpenRoot(t, map[string]string{
		"output/a.txt":       "aaa",
		"output/sub/b.json":  `{"b":1}`,
		"output/sub/deep/c":  "c",
		"output/empty/":      "",
		"other/not-listed.x": "x",
	})
	MustSymlink(t, dir, "output/link-out", filepath.Join(outside, "secret.txt"))
	MustSymlink(t, dir, "output/sub/link-in", "../a.txt")
	MustSymlink(t, dir, "output/dirlink", outside)

	files, skipped, err := ListFiles(r, "output")
	if err != nil {
		t.Fatal(err)
	}
	want := []File{
		{Name: "a.txt", Size: 3, Type: "text/plain; charset=utf-8"},
		{Name: "sub/b.json", Size: 7, Type: "application/json"},
		{Name: "sub/deep/c", Size: 1, Type: "text/plain; charset=utf-8"},
	}
	if diff := cmp.Diff(want, files); diff != "" {
		t.Errorf("files (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"dirlink", "link-out", "sub/link-in"}, skipped); diff != "" {
		t.Errorf("skipped (-want +got):\n%s", diff)
	}

	size, err := Size(r, "output")
	if err != nil || size != 11 {
		t.Errorf("Size(output) = %d, %v; want 11 (symlinks not counted)", size, err)
	}
}

func TestListFilesOfSymlinkedDirOutsideRefused(t *testing.T) {
	outside := mustOutside(t)
	r, dir := MustOpenRoot(t, map[string]string{})
	MustSymlink(t, dir, "output", outside)
	files, _, err := ListFiles(r, "output")
	if err == nil || len(files) > 0 {
		t.Errorf("ListFiles(output → outside) = %v, %v; want an error and no files", files, err)
	}
}

func TestList(t *testing.T) {
	r, dir := MustOpenRoot(t, map[string]string{
		"a.txt":        "12345",
		"data/b.csv":   "x,y",
		"data/in/c.md": "# c",
		"scripts/":     "",
	})
	MustSymlink(t, dir, "data/link", "/etc")

	paths := func(es []Entry) []string {
		var out []string
		for _, e := range es {
			s := e.Path
			if e.IsDir {
				s += "/"
			}
			out = append(out, s)
		}
		return out
	}
	top, err := List(r, "/", false)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a.txt", "data/", "scripts/"}, paths(top)); diff != "" {
		t.Errorf("List(/) (-want +got):\n%s", diff)
	}
	if top[0].Size != 5 || top[0].Modified.IsZero() {
		t.Errorf("a.txt entry = %+v, want size 5 and a time", top[0])
	}
	all, err := List(r, ".", true)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"a.txt", "data/", "data/b.csv", "data/in/", "data/in/c.md", "data/link", "scripts/"}, paths(all)); diff != "" {
		t.Errorf("List(., recursive) (-want +got):\n%s", diff)
	}
	sub, err := List(r, "/workspace/shared/data", false)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"data/b.csv", "data/in/", "data/link"}, paths(sub)); diff != "" {
		t.Errorf("List(data) (-want +got):\n%s", diff)
	}
	if _, err := List(r, "a.txt", false); !errors.Is(err, ErrNotDir) {
		t.Errorf("List(a file) = %v, want ErrNotDir", err)
	}
	if _, err := List(r, "nope", false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("List(missing) = %v, want ErrNotFound", err)
	}
	if _, err := List(r, "../", false); !errors.Is(err, ErrPathEscapes) {
		t.Errorf("List(..) = %v, want ErrPathEscapes", err)
	}
	if _, err := List(r, "data/link", false); !errors.Is(err, ErrPathEscapes) {
		t.Errorf("List(symlink to /etc) = %v, want ErrPathEscapes", err)
	}
}

func TestReadFileTruncation(t *testing.T) {
	r, _ := MustOpenRoot(t, map[string]string{"f": "0123456789"})
	tests := []struct {
		max       int64
		want      string
		truncated bool
	}{
		{0, "", true},
		{4, "0123", true},
		{9, "012345678", true},
		{10, "0123456789", false},
		{100, "0123456789", false},
	}
	for _, tt := range tests {
		data, truncated, err := ReadFile(r, "f", tt.max)
		if err != nil || string(data) != tt.want || truncated != tt.truncated {
			t.Errorf("ReadFile(max %d) = %q, %v, %v; want %q, %v", tt.max, data, truncated, err, tt.want, tt.truncated)
		}
	}
}

func TestCopyFile(t *testing.T) {
	src, _ := MustOpenRoot(t, map[string]string{"big": strings.Repeat("x", 100), "small": "hi"})
	dst, dstDir := MustOpenRoot(t, map[string]string{})
	n, err := CopyFile(src, "small", dst, "context/small", 100)
	if err != nil || n != 2 {
		t.Fatalf("CopyFile(small) = %d, %v", n, err)
	}
	if b, err := os.ReadFile(filepath.Join(dstDir, "context", "small")); err != nil || string(b) != "hi" {
		t.Errorf("copied content = %q, %v", b, err)
	}
	n, err = CopyFile(src, "big", dst, "context/big", 99)
	if !errors.Is(err, ErrTooLarge) || !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Errorf("CopyFile(100 bytes, limit 99) = %d, %v; want ErrTooLarge", n, err)
	}
	if _, err := os.Stat(filepath.Join(dstDir, "context", "big")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a refused copy left a file: %v", err)
	}
	if n, err := CopyFile(src, "big", dst, "context/big", 100); err != nil || n != 100 {
		t.Errorf("CopyFile(100 bytes, limit 100) = %d, %v", n, err)
	}
	mustNoTemp(t, filepath.Join(dstDir, "context"))
}

func mustNoTemp(tb testing.TB, dir string) {
	tb.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp-") {
			tb.Errorf("temporary file %s left in %s", e.Name(), dir)
		}
	}
}

func TestWriteFileAtomic(t *testing.T) {
	r, dir := MustOpenRoot(t, map[string]string{})
	if err := WriteFileAtomic(r, "a/b/f.txt", []byte("first version, long"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(r, "a/b/f.txt", []byte("second"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "a", "b", "f.txt")
	b, err := os.ReadFile(p)
	if err != nil || string(b) != "second" {
		t.Errorf("content = %q, %v; want second", b, err)
	}
	if info, err := os.Stat(p); err != nil || info.Mode().Perm() != 0o600 {
		t.Errorf("mode = %v, %v; want 0600", info.Mode(), err)
	}
	mustNoTemp(t, filepath.Join(dir, "a", "b"))

	// A failing fill leaves neither the file nor a temporary file.
	boom := errors.New("boom")
	err = WriteAtomic(r, "a/b/g.txt", 0o644, func(w io.Writer) error {
		w.Write([]byte("partial"))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Errorf("WriteAtomic with a failing fill = %v, want boom", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "a", "b", "g.txt")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("failed write left g.txt: %v", err)
	}
	mustNoTemp(t, filepath.Join(dir, "a", "b"))
	if b, _ := os.ReadFile(p); !bytes.Equal(b, []byte("second")) {
		t.Errorf("f.txt changed to %q", b)
	}
}

// TestSyncTreeLater: the files and directories SyncTreeLater opened are
// the ones synced, even after they were moved out and their directory
// replaced (as a warm sandbox's claim moves a task's entries); past
// maxSyncLater files it syncs the rest at once; a symbolic link is not
// followed.
func TestSyncTreeLater(t *testing.T) {
	base := t.TempDir()
	taskDir := filepath.Join(base, "task")
	for _, d := range []string{"context/notes", "output"} {
		if err := os.MkdirAll(filepath.Join(taskDir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r, err := os.OpenRoot(taskDir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	files := map[string]string{"prompt.md": "the prompt", "context/a.csv": "1,2", "context/notes/n.md": "a note"}
	for i := range maxSyncLater {
		files[fmt.Sprintf("context/many-%d", i)] = "x"
	}
	for name, content := range files {
		if err := WriteFileAtomicNoSync(r, name, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(taskDir, "context", "link")); err != nil {
		t.Fatal(err)
	}
	sync, err := SyncTreeLater(r)
	if err != nil {
		t.Fatal(err)
	}
	slot := filepath.Join(base, "slot")
	if err := os.Mkdir(slot, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(taskDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if err := os.Rename(filepath.Join(taskDir, e.Name()), filepath.Join(slot, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Rename(slot, taskDir); err != nil {
		t.Fatal(err)
	}
	if err := sync(); err != nil {
		t.Errorf("sync after the move: %v", err)
	}
	for name, content := range files {
		if b, err := os.ReadFile(filepath.Join(taskDir, name)); err != nil || string(b) != content {
			t.Errorf("%s = %q, %v", name, b, err)
		}
	}
}

func TestDetectType(t *testing.T) {
	r, _ := MustOpenRoot(t, map[string]string{
		"a.md": "# x", "b.py": "print()", "noext-text": "plain words", "noext-bin": "\x00\x01\x02\xff",
	})
	for name, want := range map[string]string{
		"a.md":       "text/markdown; charset=utf-8",
		"b.py":       "text/x-python; charset=utf-8",
		"noext-text": "text/plain; charset=utf-8",
		"noext-bin":  "application/octet-stream",
		"missing":    "application/octet-stream",
	} {
		if got := DetectType(r, name); got != want {
			t.Errorf("DetectType(%s) = %q, want %q", name, got, want)
		}
	}
}

func TestDataRoot(t *testing.T) {
	d, err := Open(filepath.Join(t.TempDir(), "data"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	for _, sub := range []string{"attachments", "documents", "tasks", "projects", "run", "shared/scripts", "shared/data", "shared/context", "shared/skills", "shared/outputs"} {
		if info, err := os.Stat(d.HostPath(sub)); err != nil || !info.IsDir() {
			t.Errorf("%s: %v", sub, err)
		}
	}
	if ids, err := d.TaskIDs(); err != nil || len(ids) != 0 {
		t.Errorf("TaskIDs of a new root = %v, %v", ids, err)
	}
	for _, id := range []string{"task-b", "task-a"} {
		r, err := d.CreateTask(id)
		if err != nil {
			t.Fatalf("CreateTask(%s): %v", id, err)
		}
		for _, sub := range []string{"context", "output", "logs"} {
			if info, err := r.Stat(sub); err != nil || !info.IsDir() {
				t.Errorf("%s/%s: %v", id, sub, err)
			}
		}
		r.Close()
	}
	if _, err := d.CreateTask("task-a"); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("second CreateTask = %v, want ErrAlreadyExists", err)
	}
	if _, err := d.CreateTask("../escape"); err == nil {
		t.Error("CreateTask(../escape) = nil error")
	}
	// A stray file in tasks/ is not a task.
	if err := os.WriteFile(d.HostPath("tasks", "README"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ids, err := d.TaskIDs()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"task-a", "task-b"}, ids); diff != "" {
		t.Errorf("TaskIDs (-want +got):\n%s", diff)
	}
	if d.TaskPath("task-a") != filepath.Join(d.Path(), "tasks", "task-a") {
		t.Errorf("TaskPath = %s", d.TaskPath("task-a"))
	}
	if _, err := d.OpenTask("task-zzz"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("OpenTask(missing) = %v, want ErrNotFound", err)
	}
	if err := d.RemoveTask("task-a"); err != nil {
		t.Fatal(err)
	}
	if err := d.RemoveTask("task-a"); err != nil {
		t.Errorf("second RemoveTask = %v, want nil", err)
	}
	if ids, _ := d.TaskIDs(); !cmp.Equal(ids, []string{"task-b"}) {
		t.Errorf("TaskIDs after remove = %v", ids)
	}
	// Open again on the same path is fine and keeps tasks.
	d2, err := Open(d.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if ids, _ := d2.TaskIDs(); !cmp.Equal(ids, []string{"task-b"}) {
		t.Errorf("TaskIDs after reopen = %v", ids)
	}
}

// Writing over an existing symbolic link replaces the link; its target,
// outside the root, is untouched.
// A link where the file goes (the worker's status.json, in a directory the
// agent writes) is replaced, never followed, durable write or not.
func TestWriteFileAtomicReplacesSymlink(t *testing.T) {
	for name, write := range map[string]func(*os.Root, string, []byte, fs.FileMode) error{
		"WriteFileAtomic": WriteFileAtomic, "WriteFileAtomicNoSync": WriteFileAtomicNoSync,
	} {
		t.Run(name, func(t *testing.T) {
			outside := mustOutside(t)
			r, dir := MustOpenRoot(t, map[string]string{})
			MustSymlink(t, dir, "f.txt", filepath.Join(outside, "secret.txt"))
			if err := write(r, "f.txt", []byte("mine"), 0o644); err != nil {
				t.Fatal(err)
			}
			if b, _ := os.ReadFile(filepath.Join(outside, "secret.txt")); string(b) != "secret" {
				t.Errorf("the link's target outside became %q", b)
			}
			info, err := os.Lstat(filepath.Join(dir, "f.txt"))
			if err != nil || !info.Mode().IsRegular() {
				t.Errorf("f.txt after the write: %v, %v; want a regular file", info, err)
			}
			if b, _ := os.ReadFile(filepath.Join(dir, "f.txt")); string(b) != "mine" {
				t.Errorf("f.txt holds %q, want mine", b)
			}
			mustNoTemp(t, dir)
			if err := write(r, "../f.txt", []byte("x"), 0o644); err == nil {
				t.Error("a name out of the root was written")
			}
		})
	}
}

// BenchmarkWriteFileAtomic writes a status.json-sized file the two ways,
// on the file system of the test's temporary directory (TMPDIR).
//
//	go test -run '^$' -bench WriteFileAtomic ./internal/workspace
func BenchmarkWriteFileAtomic(b *testing.B) {
	data := []byte(strings.Repeat("x", 300))
	for name, write := range map[string]func(*os.Root, string, []byte, fs.FileMode) error{
		"durable": WriteFileAtomic, "no-sync": WriteFileAtomicNoSync,
	} {
		b.Run(name, func(b *testing.B) {
			r, err := os.OpenRoot(b.TempDir())
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			for b.Loop() {
				if err := write(r, "status.json", data, 0o644); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestCheckFreeSpace: below the floor, and on a full disk even without a
// floor, new work is refused with ErrNoSpace; with room it is taken.
func TestCheckFreeSpace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a small filesystem needs root")
	}
	mnt := t.TempDir()
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=4m"); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(mnt, unix.MNT_DETACH) })
	d, err := Open(filepath.Join(mnt, "data"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if err := d.CheckFreeSpace(0); err != nil {
		t.Errorf("no floor, room left: %v", err)
	}
	if err := d.CheckFreeSpace(1 << 20); err != nil {
		t.Errorf("1 MiB floor on a 4 MiB disk: %v", err)
	}
	if err := d.CheckFreeSpace(8 << 20); !errors.Is(err, errdefs.ErrNoSpace) || !strings.Contains(err.Error(), "min_free_disk") {
		t.Errorf("8 MiB floor on a 4 MiB disk: %v, want ErrNoSpace naming the floor", err)
	}
	filler := filepath.Join(mnt, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	for err == nil {
		_, err = f.Write(make([]byte, 64<<10))
	}
	f.Close()
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("filling the disk: %v, want ENOSPC", err)
	}
	if err := d.CheckFreeSpace(0); !errors.Is(err, errdefs.ErrNoSpace) || !strings.Contains(err.Error(), "disk is full") {
		t.Errorf("no floor, full disk: %v, want ErrNoSpace saying the disk is full", err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if err := d.CheckFreeSpace(0); err != nil {
		t.Errorf("no floor, space freed: %v", err)
	}
}

// TestReservedNames: seed 001's reserved names are refused wherever a
// name is created, in any case and with any extension; names that only
// begin like one are not.
func TestReservedNames(t *testing.T) {
	for _, name := range []string{"CON", "con", "Nul.txt", "aux.tar.gz", "COM1", "lpt9.log", "dir/PRN", "a/com3.x/b", "NUL "} {
		if err := CheckName(name); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "reserved") {
			t.Errorf("CheckName(%q) = %v, want reserved", name, err)
		}
	}
	for _, name := range []string{"console.log", "null", "com10", "com0", "lpt", "CONtract.md", "a/aux-data/b", ".con"} {
		if err := CheckName(name); err != nil {
			t.Errorf("CheckName(%q) = %v, want nil", name, err)
		}
	}
}
