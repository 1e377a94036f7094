//go:build integration

package e2e_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// pushNote pushes a note as a host would, with POST /api/documents.
func (s *server) pushNote(t *testing.T, title, content string, meta string) service.Document {
	t.Helper()
	req := service.IngestRequest{Title: title, Content: &content}
	if meta != "" {
		req.Metadata = json.RawMessage(meta)
	}
	d, err := s.client.IngestDocument(context.Background(), req)
	if err != nil {
		t.Fatalf("push note %q: %v", title, err)
	}
	return d
}

// callTool calls a tool over POST /api/tools/{name} and decodes its answer.
func (s *server) callTool(t *testing.T, name string, args any, out any) {
	t.Helper()
	b, _ := json.Marshal(args)
	raw, err := s.client.CallTool(context.Background(), name, b)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		t.Fatalf("%s: decode %s: %v", name, raw, err)
	}
}

func hitTitles(res service.SearchResult) []string {
	var out []string
	for _, h := range res.Documents {
		out = append(out, h.Title)
	}
	return out
}

// TestNoteCompilation is seed use case 2: notes pushed by the host are
// brought into a task by note_query, the worker writes a summary, which is
// ingested as a note and found by search.
func TestNoteCompilation(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	ctx := context.Background()
	a := s.pushNote(t, "Project Alpha kickoff", "Alpha starts in March. Owner: Dana. Budget 40k.", `{"tags":["alpha","planning"]}`)
	b := s.pushNote(t, "Alpha risks", "Project alpha depends on the vendor API; risk of delay.", "")
	s.pushNote(t, "Grocery list", "eggs, milk, bread", "")
	if a.SourceType != "note" || !a.Indexed || !strings.HasPrefix(a.DocumentID, "doc-") || a.File == "" {
		t.Fatalf("pushed note %+v", a)
	}

	tk := mustSpawn(t, s.client, service.SpawnRequest{
		TaskDescription: "Compile the Project Alpha notes into one summary",
		NoteQuery:       "project alpha",
		Agent:           "command",
		Command: []string{"sh", "-c", `ls context/notes > output/notes.txt
{ echo "# Project Alpha Summary"; for f in context/notes/*.md; do sed -n 's/^title: //p' "$f"; sed '1,/^---$/d' "$f"; done; } > output/project_alpha_summary.md
grep -c '^document_id: ' context/notes/*.md | wc -l > output/frontmatter.txt
grep -q 'Notes matching .* in ./task/context/notes/' /task/prompt.md && echo "summary written"`},
	})
	if !slices.Equal(sortedCopy(tk.NoteIDs), sortedCopy([]string{a.DocumentID, b.DocumentID})) || tk.NoteQuery != "project alpha" {
		t.Errorf("spec note_ids %v (query %q), want the two alpha notes", tk.NoteIDs, tk.NoteQuery)
	}
	res := s.waitSuccess(t, tk.ID, 60*time.Second, "notes.txt", "project_alpha_summary.md", "frontmatter.txt")
	if got := strings.Fields(res.FileContents["notes.txt"].Content); !slices.Equal(got, []string{"alpha-risks.md", "project-alpha-kickoff.md"}) {
		t.Errorf("context/notes/ = %v", got)
	}
	if got := strings.TrimSpace(res.FileContents["frontmatter.txt"].Content); got != "2" {
		t.Errorf("notes with frontmatter: %s, want 2", got)
	}
	summary := res.FileContents["project_alpha_summary.md"].Content
	for _, want := range []string{"Owner: Dana", "vendor API", `"Project Alpha kickoff"`} {
		if !strings.Contains(summary, want) {
			t.Errorf("summary lacks %q:\n%s", want, summary)
		}
	}
	if strings.Contains(summary, "eggs") {
		t.Errorf("summary has the grocery note:\n%s", summary)
	}
	if res.Summary != "summary written" {
		t.Errorf("task summary %q (the prompt does not list the notes?)", res.Summary)
	}

	// The LLM ingests the summary as a note (the seed's document_type).
	var doc service.Document
	s.callTool(t, "ingest_from_workspace", map[string]any{
		"source_path": "tasks/" + tk.ID + "/output/project_alpha_summary.md", "title": "Project Alpha Summary",
		"document_type": "note", "metadata": map[string]any{"source_task_id": tk.ID},
	}, &doc)
	if doc.SourceType != "note" || doc.Source != "tasks/"+tk.ID+"/output/project_alpha_summary.md" || !doc.Indexed {
		t.Errorf("ingested %+v", doc)
	}
	found, err := s.client.SearchDocuments(ctx, service.SearchRequest{Query: "alpha summary", Type: "note"})
	if err != nil {
		t.Fatal(err)
	}
	if len(found.Documents) == 0 || found.Documents[0].DocumentID != doc.DocumentID {
		t.Errorf("search for the summary: %v, want it first", hitTitles(found))
	}
	// Its metadata is searchable too.
	found, err = s.client.SearchDocuments(ctx, service.SearchRequest{Query: tk.ID})
	if err != nil || len(found.Documents) != 1 || found.Documents[0].DocumentID != doc.DocumentID {
		t.Errorf("search by source task id: %v, %v", hitTitles(found), err)
	}

	// export_notes_to_workspace writes the same notes under shared/.
	var exp service.ExportNotesResult
	// (the summary also has these words; the original note ranks first)
	s.callTool(t, "export_notes_to_workspace", map[string]any{"query": "vendor delay", "destination_dir": "context/alpha/", "max_notes": 1}, &exp)
	if len(exp.Notes) != 1 || exp.Notes[0].Path != "context/alpha/alpha-risks.md" || exp.Exported != 1 || exp.Path != "context/alpha/" {
		t.Fatalf("export: %+v; want seed 000's exported 1, path context/alpha/, and the note", exp)
	}
	f, err := s.client.ReadWorkspace(ctx, "context/alpha/alpha-risks.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(f.Content, "---\ntitle: \"Alpha risks\"\ndocument_id: \""+b.DocumentID+"\"\n") || !strings.Contains(f.Content, "vendor API") {
		t.Errorf("exported note:\n%s", f.Content)
	}
	// The index survives a restart of the read model: it is on disk, and
	// every event is there to rebuild it.
	types := s.eventTypes(t, task.DocumentStreamID(doc.DocumentID))
	if !slices.Equal(types, []string{task.EventDocumentIngested}) {
		t.Errorf("document stream: %v", types)
	}
	if types := s.eventTypes(t, task.DocumentStreamID(a.DocumentID)); !slices.Equal(types, []string{task.EventNoteCreated}) {
		t.Errorf("note stream: %v", types)
	}
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

// TestDocumentsIntoContext ingests shared files (text and PDF) and brings
// one into a task by document_ids.
func TestDocumentsIntoContext(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	ctx := context.Background()
	csv := "quarter,revenue\nQ1,100\nQ2,250\n"
	s.mustWriteWorkspace(t, "data/revenue report.csv", []byte(csv))
	s.mustWriteWorkspace(t, "data/statement.pdf", []byte("%PDF-1.4\n1 0 obj <<>> endobj\n\x00\x01binary"))
	d, err := s.client.IngestDocument(ctx, service.IngestRequest{SourcePath: "/workspace/shared/data/revenue report.csv", Title: "Revenue by quarter", SourceType: "imported"})
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "revenue report.csv" || d.File != d.DocumentID+"_revenue_report.csv" || d.Size != int64(len(csv)) || !d.Indexed || len(d.SHA256) != 64 || d.Source != "shared/data/revenue report.csv" {
		t.Errorf("ingested %+v", d)
	}
	if b, err := os.ReadFile(filepath.Join(s.data, "documents", d.File)); err != nil || string(b) != csv {
		t.Errorf("documents/%s: %q, %v", d.File, b, err)
	}
	pdf, err := s.client.IngestDocument(ctx, service.IngestRequest{SourcePath: "shared/data/statement.pdf", Title: "Bank statement March"})
	if err != nil {
		t.Fatal(err)
	}
	if pdf.Indexed || !strings.Contains(pdf.IndexNote, "PDF") || pdf.ContentType != "application/pdf" {
		t.Errorf("pdf: indexed %v, note %q, type %q", pdf.Indexed, pdf.IndexNote, pdf.ContentType)
	}
	for q, want := range map[string]string{"Q2 revenue": d.DocumentID, "statement": pdf.DocumentID} {
		res, err := s.client.SearchDocuments(ctx, service.SearchRequest{Query: q})
		if err != nil || len(res.Documents) == 0 || res.Documents[0].DocumentID != want {
			t.Errorf("search %q: %v, %v", q, hitTitles(res), err)
		}
	}

	tk := mustSpawn(t, s.client, service.SpawnRequest{
		TaskDescription: "sum the revenue", DocumentIDs: []string{d.DocumentID}, Agent: "command",
		Command: []string{"sh", "-c", `awk -F, 'NR>1{s+=$2} END{print s}' context/` + d.File + ` > output/sum.txt`},
	})
	res := s.wait(t, tk.ID, 60*time.Second, "sum.txt")
	if res.Status != task.Success || res.FileContents["sum.txt"].Content != "350\n" {
		t.Errorf("status %s, sum %q (%s)", res.Status, res.FileContents["sum.txt"].Content, res.ErrorMessage)
	}
	prompt, _ := os.ReadFile(filepath.Join(s.data, "tasks", tk.ID, "prompt.md"))
	if !strings.Contains(string(prompt), "/task/context/"+d.File+"`: Revenue by quarter") {
		t.Errorf("prompt.md does not list the document:\n%s", prompt)
	}
}

// TestDataTransformation is seed use case 4: a messy CSV cleaned by a
// worker, the result ingested and saved to shared/.
func TestDataTransformation(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	ctx := context.Background()
	messy := "name , date ,amount\n  Alice ,2026/01/05, 10\n\n,,\nBob,2026/1/7 ,  20 \n   \n"
	s.mustWriteWorkspace(t, "data/messy_data.csv", []byte(messy))
	tk := mustSpawn(t, s.client, service.SpawnRequest{
		TaskDescription: "Read data/messy_data.csv. Clean: remove empty rows, normalize dates, trim whitespace. Output as cleaned_data.csv with summary of changes.",
		ContextFiles:    []string{"data/messy_data.csv"}, Agent: "command",
		Command: []string{"sh", "-c", `awk -F, 'BEGIN{OFS=","} {for(i=1;i<=NF;i++){gsub(/^ +| +$/,"",$i)} line=$0; gsub(/[ ,]/,"",line); if(line==""){dropped++; next} if(NR>1){split($2,d,"/"); $2=sprintf("%04d-%02d-%02d",d[1],d[2],d[3])} print} END{print dropped > "output/dropped.txt"}' context/messy_data.csv > output/cleaned_data.csv
printf '# Cleaning report\n\nRows removed: %s\n' "$(cat output/dropped.txt)" > output/cleaning_report.md && rm output/dropped.txt`},
	})
	res := s.waitSuccess(t, tk.ID, 60*time.Second, "cleaned_data.csv", "cleaning_report.md")
	want := "name,date,amount\nAlice,2026-01-05,10\nBob,2026-01-07,20\n"
	if got := res.FileContents["cleaned_data.csv"].Content; got != want {
		t.Errorf("cleaned_data.csv = %q, want %q", got, want)
	}
	if got := res.FileContents["cleaning_report.md"].Content; !strings.Contains(got, "Rows removed: 3") {
		t.Errorf("cleaning_report.md = %q", got)
	}
	// b. ingest the CSV for search; c. save it for later.
	var doc service.Document
	s.callTool(t, "ingest_from_workspace", map[string]any{"source_path": "tasks/" + tk.ID + "/output/cleaned_data.csv", "title": "Cleaned data"}, &doc)
	if doc.SourceType != "worker_output" || !doc.Indexed {
		t.Errorf("ingested %+v", doc)
	}
	found, err := s.client.SearchDocuments(ctx, service.SearchRequest{Query: "Alice", Type: "document"})
	if err != nil || len(found.Documents) != 1 || found.Documents[0].DocumentID != doc.DocumentID || !strings.Contains(found.Documents[0].Snippet, "**Alice**") {
		t.Errorf("search Alice: %+v, %v", found, err)
	}
	s.mustWriteWorkspace(t, "data/cleaned_data.csv", []byte(res.FileContents["cleaned_data.csv"].Content))
}

// TestDocumentsBadInput: each bad request is a clear 4xx, and leaves no
// file in documents/ or shared/, no event and no task directory.
func TestDocumentsBadInput(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	ctx := context.Background()
	s.mustWriteWorkspace(t, "data/ok.txt", []byte("fine"))
	done := s.spawn(t, "a task with a prompt", "sh", "-c", "echo hi > output/hi.txt")
	s.wait(t, done.ID, 60*time.Second)
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644)
	os.Symlink(filepath.Join(outside, "secret"), filepath.Join(s.data, "shared", "data", "link"))
	before := s.snapshot(t)
	unknown := "doc-" + strings.Repeat("0", 26)
	cases := []struct {
		name, method, path, body string
		status                   int
		mention                  string
	}{
		{"dotdot", "POST", "/api/documents", `{"source_path":"../corral.db","title":"x"}`, 403, "source_path"},
		{"task dotdot", "POST", "/api/documents", `{"source_path":"tasks/` + done.ID + `/output/../prompt.md","title":"x"}`, 403, "source_path"},
		{"task non-output", "POST", "/api/documents", `{"source_path":"tasks/` + done.ID + `/prompt.md","title":"x"}`, 403, "output"},
		{"symlink out", "POST", "/api/documents", `{"source_path":"data/link","title":"x"}`, 403, "source_path"},
		{"missing file", "POST", "/api/documents", `{"source_path":"data/nope.txt","title":"x"}`, 422, "source_path"},
		{"unknown task", "POST", "/api/documents", `{"source_path":"tasks/task-00000000000000000000000000/output/a","title":"x"}`, 422, "source_path"},
		{"no title", "POST", "/api/documents", `{"source_path":"data/ok.txt"}`, 400, "title"},
		{"both", "POST", "/api/documents", `{"source_path":"data/ok.txt","content":"x","title":"x"}`, 400, "content"},
		{"neither", "POST", "/api/documents", `{"title":"x"}`, 400, "source_path"},
		{"bad source type", "POST", "/api/documents", `{"source_path":"data/ok.txt","title":"x","source_type":"pdf"}`, 400, "source_type"},
		{"metadata not object", "POST", "/api/documents", `{"content":"x","title":"x","metadata":[1]}`, 400, "metadata"},
		{"nul content", "POST", "/api/documents", `{"content":"a\u0000b","title":"x"}`, 400, "content"},
		{"unknown field", "POST", "/api/documents", `{"content":"x","title":"x","tags":[]}`, 400, "tags"},
		{"empty query", "GET", "/api/documents?q=%20%3F", "", 400, "q"},
		{"bad limit", "GET", "/api/documents?q=x&limit=1000", "", 400, "limit"},
		{"bad type", "GET", "/api/documents?q=x&type=pdf", "", 400, "type"},
		{"export outside", "POST", "/api/documents/export", `{"query":"x","destination_dir":"../x"}`, 403, "destination_dir"},
		{"export root", "POST", "/api/documents/export", `{"query":"x","destination_dir":""}`, 400, "destination_dir"},
		{"export no query", "POST", "/api/documents/export", `{"destination_dir":"context/x"}`, 400, "query"},
		{"spawn unknown document", "POST", "/api/tasks", `{"task_description":"x","command":["true"],"document_ids":["` + unknown + `"]}`, 422, "document_ids[0]"},
		{"spawn malformed document", "POST", "/api/tasks", `{"task_description":"x","command":["true"],"document_ids":["../etc"]}`, 400, "document_ids[0]"},
		{"spawn empty note query", "POST", "/api/tasks", `{"task_description":"x","command":["true"],"note_query":"?!"}`, 400, "note_query"},
	}
	for _, c := range cases {
		var body *strings.Reader
		if c.body != "" {
			body = strings.NewReader(c.body)
		}
		var code int
		var resp string
		if body != nil {
			code, resp = s.do(t, c.method, c.path, "application/json", body)
		} else {
			code, resp = s.do(t, c.method, c.path, "", nil)
		}
		if code != c.status || !strings.Contains(resp, c.mention) {
			t.Errorf("%s: %d %s, want %d mentioning %q", c.name, code, resp, c.status, c.mention)
		}
	}
	if after := s.snapshot(t); after != before {
		t.Errorf("bad input changed something: %+v -> %+v", before, after)
	}
	if ents, _ := os.ReadDir(filepath.Join(s.data, "documents")); len(ents) != 0 {
		t.Errorf("documents/ holds %d files after bad input", len(ents))
	}
	if _, err := os.Stat(filepath.Join(s.data, "shared", "context", "x")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("export wrote shared/context/x: %v", err)
	}
	// The client maps them back to their classes.
	_, err := s.client.IngestDocument(ctx, service.IngestRequest{SourcePath: "../x", Title: "x"})
	if !errors.Is(err, errdefs.ErrPermissionDenied) {
		t.Errorf("client: %v", err)
	}
}

// TestWorkspaceRawRead: GET /api/workspace/{path}?raw=1 answers a shared
// file's bytes whole, past the JSON read's cut, as a download that is
// never sniffed; a symbolic link is refused, as everywhere.
func TestWorkspaceRawRead(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	ctx := context.Background()
	big := make([]byte, 300<<10)
	for i := range big {
		big[i] = byte(i * 7)
	}
	if err := os.MkdirAll(filepath.Join(s.data, "shared", "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.data, "shared", "data", "big.bin"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	if f, err := s.client.ReadWorkspace(ctx, "data/big.bin"); err != nil || !f.Truncated {
		t.Fatalf("the JSON read of 300 KiB: truncated %v, %v; want cut", f.Truncated, err)
	}
	for name, set := range map[string]func(*http.Request){
		"?raw=1":       func(r *http.Request) { r.URL.RawQuery = "raw=1" },
		"Accept octet": func(r *http.Request) { r.Header.Set("Accept", "application/octet-stream") },
	} {
		req, _ := http.NewRequest("GET", s.url+"/api/workspace/data/big.bin", nil)
		req.Header.Set("Authorization", "Bearer "+s.token)
		set(req)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Equal(body, big) || resp.Header.Get("X-Content-Type-Options") != "nosniff" || !strings.HasPrefix(resp.Header.Get("Content-Disposition"), "attachment") {
			t.Errorf("%s: %s, %d bytes, headers %v; want the 300 KiB whole, a download", name, resp.Status, len(body), resp.Header)
		}
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(s.data, "shared", "data", "link")); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", s.url+"/api/workspace/data/link?raw=1", nil)
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode == 200 || strings.Contains(string(body), "root:") {
		t.Errorf("a link read raw: %s %q", resp.Status, body)
	}
}

// TestSharedWritesAreEvents: a caller's write into shared/ (PUT
// /api/workspace/..., which the web UI's uploads use, and write_workspace)
// is a shared_file_written event with its path, size, sha256 and actor.
func TestSharedWritesAreEvents(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	ctx := context.Background()
	if _, err := s.client.WriteWorkspace(ctx, "data/a.txt", []byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	var w map[string]any
	s.callTool(t, "write_workspace", map[string]any{"path": "notes/b.md", "content": "# b\n"}, &w)
	var got []task.SharedFileWritten
	err := s.client.Events(ctx, service.EventsRequest{}, func(e eventstore.Event) error {
		if e.StreamID == task.SharedStreamID && e.Type == task.EventSharedFileWritten {
			var f task.SharedFileWritten
			if err := json.Unmarshal(e.Data, &f); err != nil {
				return err
			}
			if e.Actor == "" {
				t.Errorf("%s written with no actor", f.Path)
			}
			got = append(got, f)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []task.SharedFileWritten{
		{Path: "data/a.txt", Size: 6, SHA256: "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"},
		{Path: "notes/b.md", Size: 4, SHA256: fmt.Sprintf("%x", sha256.Sum256([]byte("# b\n")))},
	}
	if !slices.Equal(got, want) {
		t.Errorf("shared_file_written events %+v, want %+v", got, want)
	}
}
