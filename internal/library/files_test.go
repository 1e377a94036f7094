package library

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/workspace"
)

// MustShared writes a file beneath shared/.
func (f *fixture) MustShared(tb testing.TB, name, content string) {
	tb.Helper()
	p := f.data.HostPath("shared", name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		tb.Fatal(err)
	}
}

func TestReadWorkspace(t *testing.T) {
	f := MustNew(t, func(o *Options) { o.Limits.MaxReadBytes = 100 })
	ctx := context.Background()
	bin := "\x00\x01\x02\xff\xfe"
	f.MustShared(t, "data/blob", bin)
	f.MustShared(t, "data/big.txt", strings.Repeat("y", 300))
	f.MustShared(t, "data/accents.txt", "a"+strings.Repeat("é", 100))

	got, err := f.lib.ReadWorkspace(ctx, "/workspace/shared/data/blob")
	if err != nil {
		t.Fatal(err)
	}
	if got.Encoding != "base64" || got.Content != base64.StdEncoding.EncodeToString([]byte(bin)) || got.Truncated || got.Size != 5 || got.Path != "data/blob" {
		t.Errorf("binary file = %+v", got)
	}
	got, err = f.lib.ReadWorkspace(ctx, "data/big.txt")
	if err != nil {
		t.Fatal(err)
	}
	if got.Encoding != "utf-8" || got.Content != strings.Repeat("y", 100) || !got.Truncated || got.Size != 300 || got.Note != "content cut at 100 bytes of 300 bytes" {
		t.Errorf("big text = %+v", got)
	}
	// Cut inside a two-byte rune: the partial rune is dropped, it stays text.
	got, err = f.lib.ReadWorkspace(ctx, "data/accents.txt")
	if err != nil {
		t.Fatal(err)
	}
	if got.Encoding != "utf-8" || got.Content != "a"+strings.Repeat("é", 49) || !got.Truncated {
		t.Errorf("text cut in a rune = %q (%s, truncated %v)", got.Content, got.Encoding, got.Truncated)
	}
	for p, class := range map[string]error{"../events.db": workspace.ErrPathEscapes, "data/none": errdefs.ErrNotFound, "data": workspace.ErrIsDir} {
		_, err := f.lib.ReadWorkspace(ctx, p)
		var fe *errdefs.FieldError
		if !errors.Is(err, class) || !errors.As(err, &fe) || fe.Field != "path" {
			t.Errorf("ReadWorkspace(%q) = %v, want a path FieldError wrapping %v", p, err, class)
		}
	}
}

func TestWriteWorkspace(t *testing.T) {
	f := MustNew(t, func(o *Options) { o.Limits.MaxWriteBytes = 1000 })
	ctx := context.Background()
	e, err := f.lib.WriteWorkspace(ctx, "/workspace/shared/scripts/new/run.sh", []byte("echo hi\n"))
	if err != nil {
		t.Fatal(err)
	}
	if e.Path != "scripts/new/run.sh" || e.Size != 8 {
		t.Errorf("entry = %+v", e)
	}
	if b, err := os.ReadFile(f.data.HostPath("shared", "scripts", "new", "run.sh")); err != nil || string(b) != "echo hi\n" {
		t.Errorf("written = %q, %v", b, err)
	}
	_, err = f.lib.WriteWorkspace(ctx, "data/too-big", make([]byte, 1001))
	var fe *errdefs.FieldError
	if !errors.Is(err, errdefs.ErrTooLarge) || !errors.As(err, &fe) || fe.Field != "content" {
		t.Errorf("WriteWorkspace(1001 bytes) = %v, want ErrTooLarge on content", err)
	}
	if _, err := os.Stat(f.data.HostPath("shared", "data", "too-big")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("an oversize write left a file: %v", err)
	}
	for _, p := range []string{"../tasks/x", "/", "a\\b"} {
		if _, err := f.lib.WriteWorkspace(ctx, p, []byte("x")); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("WriteWorkspace(%q) = %v, want ErrInvalidArgument", p, err)
		}
	}
	if _, err := os.Stat(f.data.HostPath("tasks", "x")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a write escaped shared/: %v", err)
	}
}
