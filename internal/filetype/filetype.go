// Package filetype says what kind of file a name and its first bytes are,
// as a MIME type: content detection by github.com/gabriel-vasile/mimetype
// (which looks inside zip containers, so an .xlsx or .docx is not just
// "application/zip", and tells JSON from plain text), with the extension
// deciding among text types that content cannot tell apart (a .ts file is
// TypeScript, a .csv CSV).
package filetype

import (
	"mime"
	"path"
	"strings"

	"github.com/gabriel-vasile/mimetype"
)

// HeadBytes is how much of a file's start Detect needs.
const HeadBytes = 3072

// textByExt are text formats content detection cannot tell apart, by
// extension. They win over the system's mime.types, which maps .ts to Qt
// Linguist.
var textByExt = map[string]string{
	".md": "text/markdown", ".markdown": "text/markdown", ".csv": "text/csv", ".tsv": "text/tab-separated-values",
	".py": "text/x-python", ".sh": "text/x-shellscript", ".bash": "text/x-shellscript",
	".js": "text/javascript", ".mjs": "text/javascript", ".ts": "text/x-typescript", ".tsx": "text/x-typescript",
	".go": "text/x-go", ".rs": "text/x-rust", ".rb": "text/x-ruby", ".pl": "text/x-perl", ".lua": "text/x-lua",
	".php": "text/x-php", ".r": "text/x-r", ".c": "text/x-c", ".h": "text/x-c", ".java": "text/x-java",
	".yaml": "application/yaml", ".yml": "application/yaml", ".toml": "application/toml",
	".json": "application/json", ".jsonl": "application/jsonl", ".txt": "text/plain",
	".html": "text/html", ".css": "text/css", ".xml": "text/xml", ".svg": "image/svg+xml",
}

// Detect returns the MIME type of a file called name whose first bytes
// (up to HeadBytes) are head. text/ types carry "; charset=utf-8".
func Detect(name string, head []byte) string {
	detected := mimetype.Detect(head)
	ext := strings.ToLower(path.Ext(name))
	isText := false
	for m := detected; m != nil; m = m.Parent() {
		if m.Is("text/plain") {
			isText = true
			break
		}
	}
	if t, ok := textByExt[ext]; ok && (isText || len(head) == 0) {
		return withCharset(t)
	}
	t := detected.String()
	if generic := detected.Is("text/plain") || detected.Is("application/octet-stream"); generic {
		// Content says no more than text or bytes: the extension may.
		if byExt := mime.TypeByExtension(ext); byExt != "" && strings.HasPrefix(byExt, "text/") == isText {
			return byExt
		}
	}
	return t
}

// withCharset adds "; charset=utf-8" to a text/ type.
func withCharset(t string) string {
	if strings.HasPrefix(t, "text/") {
		return t + "; charset=utf-8"
	}
	return t
}
