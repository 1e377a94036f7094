package webui

import (
	"io/fs"
	"net/http"
	"net/http/httptest"
	"path"
	"regexp"
	"strings"
	"testing"
)

func TestServes(t *testing.T) {
	for p, want := range map[string]bool{
		"/": true, "/tasks": true, "/tasks/task-x": true, "/spawn": true, "/workspace/shared/a/b.txt": true,
		"/sessions/sess-1": true, "/skills/x": true, "/documents": true, "/deliveries": true, "/health": true,
		"/assets/app.js": true, "/assets/pages/task.js": true,
		"/api/tasks": false, "/api/": false, "/mcp": false, "/healthz": false, "/metrics": false,
		"/assets/missing.js": false, "/assets/": false, "/index.html": false, "/favicon.ico": false,
	} {
		if got := Serves(p); got != want {
			t.Errorf("Serves(%q) = %v, want %v", p, got, want)
		}
	}
}

func TestHandler(t *testing.T) {
	h := Handler()
	get := func(method, p string, hdr ...string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, p, nil)
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for _, c := range []struct {
		path, typ, body string
	}{
		{"/", "text/html; charset=utf-8", `<script type="module" src="/assets/boot.js">`},
		{"/tasks/task-01x", "text/html; charset=utf-8", `<script type="module" src="/assets/boot.js">`},
		{"/assets/app.js", "text/javascript; charset=utf-8", "import "},
		{"/assets/app.css", "text/css; charset=utf-8", ":root"},
		{"/assets/icon.svg", "image/svg+xml", "<svg"},
	} {
		w := get("GET", c.path)
		if w.Code != 200 || w.Header().Get("Content-Type") != c.typ || !strings.Contains(w.Body.String(), c.body) {
			t.Errorf("GET %s: %d %q, want 200 %q with %q", c.path, w.Code, w.Header().Get("Content-Type"), c.typ, c.body)
		}
		for k, v := range map[string]string{"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"} {
			if got := w.Header().Get(k); got != v {
				t.Errorf("GET %s: %s %q, want %q", c.path, k, got, v)
			}
		}
		if again := get("GET", c.path, "If-None-Match", w.Header().Get("ETag")); again.Code != http.StatusNotModified {
			t.Errorf("GET %s with its ETag: %d, want 304", c.path, again.Code)
		}
	}
	if w := get("POST", "/tasks"); w.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /tasks: %d, want 405", w.Code)
	}
	if w := get("GET", "/api/tasks"); w.Code != http.StatusNotFound {
		t.Errorf("GET /api/tasks from the UI handler: %d, want 404", w.Code)
	}
}

// The CSP allows no inline script or style, and the app writes no HTML
// from strings: these conventions are checked here, so that a change that
// breaks one fails without a browser.
func TestAssetsFollowTheCSP(t *testing.T) {
	index, _ := static.ReadFile("static/index.html")
	for _, bad := range []*regexp.Regexp{
		regexp.MustCompile(`<script(?:\s+type="module")?>`), // inline script
		regexp.MustCompile(`\sstyle=`),                      // inline style
		regexp.MustCompile(`<style`),                        // style element
		regexp.MustCompile(`\son[a-z]+=`),                   // inline handler
		regexp.MustCompile(`(?i)(src|href)="(https?:)?//`),  // another origin
	} {
		if bad.Match(index) {
			t.Errorf("index.html has %s", bad)
		}
	}
	sinks := regexp.MustCompile(`innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function|\.style\.|setAttribute\('style'|srcdoc`)
	imports := regexp.MustCompile(`(?m)^import .* from '([^']+)';|^\} from '([^']+)';|\bimport\('([^']+)'\)`)
	fs.WalkDir(static, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || path.Ext(p) != ".js" {
			return err
		}
		b, _ := static.ReadFile(p)
		if m := sinks.Find(b); m != nil {
			t.Errorf("%s uses %s", p, m)
		}
		// Every module it imports is embedded.
		for _, m := range imports.FindAllSubmatch(b, -1) {
			dep := string(m[1]) + string(m[2]) + string(m[3])
			if _, err := fs.Stat(static, path.Join(path.Dir(p), dep)); err != nil {
				t.Errorf("%s imports %s, which is not embedded", p, dep)
			}
		}
		return nil
	})
}
