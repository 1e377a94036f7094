package httpapi

import (
	"context"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// outputs is a Backend whose tasks' output files are the files of a
// directory.
type outputs struct {
	stub
	dir string
}

func (o *outputs) OpenOutput(_ context.Context, _, p string) (*os.File, fs.FileInfo, error) {
	f, err := os.Open(filepath.Join(o.dir, p))
	if err != nil {
		return nil, nil, err
	}
	info, err := f.Stat()
	return f, info, err
}

// A worker chooses its files' names and bytes: only a PNG, JPEG, GIF or
// WebP image, by content, is served for display; everything else
// (SVG, HTML, HTML named .png) is a download, and nothing is sniffed.
func TestTaskFilesAreDownloadsUnlessSafeImages(t *testing.T) {
	dir := t.TempDir()
	png := []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00\x00")
	files := map[string][]byte{
		"chart.png":   png,
		"photo.jpg":   []byte("\xff\xd8\xff\xe0\x00\x10JFIF\x00"),
		"evil.svg":    []byte(`<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>`),
		"page.html":   []byte(`<html><script>alert(1)</script></html>`),
		"fake.png":    []byte(`<html><script>alert(1)</script></html>`),
		"report.md":   []byte("# Report\n"),
		`x"; y=.html`: []byte("text"),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	hs := httptest.NewServer(newTestServer(&outputs{dir: dir}, Options{}, slogTo(io.Discard)).Handler())
	t.Cleanup(hs.Close)
	for name, inline := range map[string]bool{"chart.png": true, "photo.jpg": true, "evil.svg": false, "page.html": false, "fake.png": false, "report.md": false, `x"; y=.html`: false} {
		resp, err := http.Get(hs.URL + "/api/tasks/task-1/files/" + strings.ReplaceAll(strings.ReplaceAll(name, `"`, "%22"), " ", "%20"))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		h := resp.Header
		if resp.StatusCode != 200 || string(body) != string(files[name]) {
			t.Errorf("%s: %d, body %q", name, resp.StatusCode, body)
			continue
		}
		if h.Get("X-Content-Type-Options") != "nosniff" || !strings.Contains(h.Get("Content-Security-Policy"), "sandbox") {
			t.Errorf("%s: nosniff %q, CSP %q", name, h.Get("X-Content-Type-Options"), h.Get("Content-Security-Policy"))
		}
		disp := h.Get("Content-Disposition")
		if inline {
			if disp != "" || !InlineImage(h.Get("Content-Type")) {
				t.Errorf("%s: type %q, disposition %q; want an image shown inline", name, h.Get("Content-Type"), disp)
			}
		} else if !strings.HasPrefix(disp, "attachment") || InlineImage(h.Get("Content-Type")) {
			t.Errorf("%s: type %q, disposition %q; want a download", name, h.Get("Content-Type"), disp)
		}
	}
}
