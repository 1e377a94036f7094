package document

import (
	"bytes"
	"encoding/json"
	"strings"
	"time"
)

// Markdown returns a note (or any text document) as a Markdown file with
// YAML frontmatter: its title, id, source type, creation time, source and
// metadata, then its content. Values are written as JSON, which is valid
// YAML, so no title or metadata can break the frontmatter.
func Markdown(d Doc, content []byte) []byte {
	var b bytes.Buffer
	field := func(k string, v any) {
		b.WriteString(k)
		b.WriteString(": ")
		enc := json.NewEncoder(&b) // ends the line
		enc.SetEscapeHTML(false)
		enc.Encode(v)
	}
	b.WriteString("---\n")
	field("title", d.Title)
	field("document_id", d.DocumentID)
	field("source_type", d.SourceType)
	field("created_at", d.CreatedAt.UTC().Format(time.RFC3339))
	if d.Source != "" {
		field("source", d.Source)
	}
	if len(d.Metadata) > 0 && string(d.Metadata) != "null" {
		var compact bytes.Buffer
		if json.Compact(&compact, d.Metadata) == nil {
			b.WriteString("metadata: ")
			b.Write(compact.Bytes())
			b.WriteByte('\n')
		}
	}
	b.WriteString("---\n\n")
	b.Write(content)
	if len(content) > 0 && !strings.HasSuffix(string(content), "\n") {
		b.WriteByte('\n')
	}
	return b.Bytes()
}
