// Package webui is Corral's web UI: plain ES modules and CSS written for
// Corral (no build step, no third-party code), embedded in the binary so
// that `go build` alone makes a working UI. Handler serves the assets under
// /assets/ and the app's one page, index.html, at every page path, so a
// task's link (/tasks/{id}) loads the app, which then reads the API with
// the bearer token it asked for.
//
// Every answer carries a strict Content-Security-Policy (scripts and
// styles from this origin only, nothing inline, images also from blob:
// URLs, no frames, no plugins, Trusted Types required so that no string
// reaches an HTML sink), nosniff and no-referrer. Assets are revalidated on
// each load against an ETag that is their content's hash, so a new binary
// never leaves a browser on old code.
package webui

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed static
var static embed.FS

// CSP is the Content-Security-Policy of every UI answer. img-src allows
// blob: because images the API serves need the bearer token: the app
// fetches them with it and shows them from object URLs.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; connect-src 'self'; " +
	"base-uri 'none'; form-action 'self'; frame-ancestors 'none'; object-src 'none'; " +
	"require-trusted-types-for 'script'; trusted-types 'none'"

// pages are the first segments of the app's page paths; "" is "/".
var pages = map[string]bool{
	"": true, "tasks": true, "spawn": true, "workspace": true, "sessions": true,
	"skills": true, "documents": true, "deliveries": true, "health": true,
}

// asset is one embedded file, ready to serve.
type asset struct {
	body []byte
	typ  string
	etag string
}

// contentTypes are the asset types, fixed here rather than taken from the
// host's mime.types, which differ between systems.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
}

var assets = load()

func load() map[string]asset {
	out := map[string]asset{}
	err := fs.WalkDir(static, "static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := static.ReadFile(p)
		if err != nil {
			return err
		}
		typ, ok := contentTypes[path.Ext(p)]
		if !ok {
			typ = "application/octet-stream"
		}
		sum := sha256.Sum256(b)
		out[strings.TrimPrefix(p, "static")] = asset{body: b, typ: typ, etag: `"` + hex.EncodeToString(sum[:16]) + `"`}
		return nil
	})
	if err != nil {
		panic("webui: read the embedded assets: " + err.Error())
	}
	return out
}

// Serves reports whether the UI answers path: a page of the app or one of
// its assets. Every other path (the API, /mcp, /healthz, /metrics) is
// left to its own handler.
func Serves(p string) bool {
	if rest, ok := strings.CutPrefix(p, "/assets/"); ok {
		_, found := assets["/assets/"+rest]
		return found
	}
	first, _, _ := strings.Cut(strings.TrimPrefix(p, "/"), "/")
	return pages[first]
}

// Handler serves the UI: the asset a path names, or index.html for a page
// path. It answers GET and HEAD only (405 otherwise) and 404 for a path
// Serves refuses.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", CSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		if !Serves(r.URL.Path) {
			http.NotFound(w, r)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		a, ok := assets[r.URL.Path]
		if !ok {
			a = assets["/index.html"]
		}
		h.Set("Content-Type", a.typ)
		h.Set("ETag", a.etag)
		h.Set("Cache-Control", "no-cache")
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.body))
	})
}
