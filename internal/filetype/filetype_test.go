package filetype

import (
	"archive/zip"
	"bytes"
	"strings"
	"testing"
)

// zipWith returns a zip holding the named (empty) entries: the start of an
// Office Open XML document.
func zipWith(t *testing.T, names ...string) []byte {
	t.Helper()
	var b bytes.Buffer
	w := zip.NewWriter(&b)
	for _, n := range names {
		if _, err := w.Create(n); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestDetect(t *testing.T) {
	for _, tc := range []struct {
		name string
		head []byte
		want string // a prefix of the result
	}{
		{"report.xlsx", zipWith(t, "[Content_Types].xml", "xl/workbook.xml"), "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"},
		{"letter.docx", zipWith(t, "[Content_Types].xml", "word/document.xml"), "application/vnd.openxmlformats-officedocument.wordprocessingml.document"},
		{"data.json", []byte(`{"amount": 12.5, "items": [1, 2]}`), "application/json"},
		{"noext", []byte(`{"amount": 12.5}`), "application/json"},
		{"main.ts", []byte("export const x: number = 1;\n"), "text/x-typescript"},
		{"sales.csv", []byte("date,amount\n2026-10-01,3\n"), "text/csv"},
		{"notes.md", []byte("# Title\n"), "text/markdown"},
		{"chart.png", []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"), "image/png"},
		{"fake.csv", []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"), "image/png"}, // content wins over a text extension
		{"doc.pdf", []byte("%PDF-1.7\n"), "application/pdf"},
	} {
		if got := Detect(tc.name, tc.head); !strings.HasPrefix(got, tc.want) {
			t.Errorf("Detect(%s) = %q, want %q", tc.name, got, tc.want)
		}
	}
}
