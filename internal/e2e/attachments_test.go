//go:build integration

package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// statement is a small bank statement: date, category, amount.
const statement = "date,category,amount\n2025-01-02,groceries,-42.10\n2025-01-03,rent,-900.00\n2025-01-05,groceries,-17.90\n2025-01-09,salary,2500.00\n"

// chartScript stands in for the model's work: it totals the statement by
// category and writes a PNG (the signature and a header are enough for
// the type to be sniffed as image/png).
const chartScript = `awk -F, 'NR>1{t[$2]+=$3} END{for(k in t) printf "%s %.2f\n", k, t[k]}' context/statement.csv | sort > output/totals.txt && printf '\211PNG\r\n\032\n\000\000\000\rIHDR\000\000\000\001\000\000\000\001\010\002\000\000\000' > output/chart.png`

// runCLI runs the corral binary against s and returns its stdout.
func (s *server) runCLI(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(corralBin, args...)
	cmd.Env = append(os.Environ(), "CORRAL_API_TOKEN="+s.app.Token())
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("corral %v: %v\n%s", args, err, errb.String())
	}
	return out.String()
}

// eventTypes returns the types of every event on stream.
func (s *server) eventTypes(t *testing.T, stream string) []string {
	t.Helper()
	var types []string
	err := s.client.Events(context.Background(), service.EventsRequest{}, func(e eventstore.Event) error {
		if e.StreamID == stream {
			types = append(types, e.Type)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return types
}

// taskEvent returns the data of the first event of typ on a task's stream.
func (s *server) taskEvent(t *testing.T, id, typ string) json.RawMessage {
	t.Helper()
	var data json.RawMessage
	s.client.Events(context.Background(), service.EventsRequest{TaskID: id}, func(e eventstore.Event) error {
		if e.Type == typ && data == nil {
			data = e.Data
		}
		return nil
	})
	if data == nil {
		t.Fatalf("task %s has no %s event", id, typ)
	}
	return data
}

// attachmentFiles lists every file under the data root's attachments/.
func attachmentFiles(t *testing.T, data string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(filepath.Join(data, "attachments"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// Use case 1: a statement uploaded with `corral run --attach`, totals and
// a chart out, the chart made an attachment and downloaded with `corral
// attachments get`.
func TestBankStatementAnalysis(t *testing.T) {
	s := MustStart(t, nil)
	dir := t.TempDir()
	csv := filepath.Join(dir, "statement.csv")
	os.WriteFile(csv, []byte(statement), 0o644)

	out := s.runCLI(t, "run", "--server", s.url, "--json", "--attach", csv, "Total my spending by category and chart it", "--", "sh", "-c", chartScript)
	var tk task.Task
	if err := json.Unmarshal([]byte(out), &tk); err != nil {
		t.Fatalf("corral run --json: %v: %s", err, out)
	}
	if len(tk.AttachmentIDs) != 1 {
		t.Fatalf("task attachment_ids %v, want one", tk.AttachmentIDs)
	}
	res := s.waitSuccess(t, tk.ID, 30*time.Second, "totals.txt")
	if got, want := res.FileContents["totals.txt"].Content, "groceries -60.00\nrent -900.00\nsalary 2500.00\n"; got != want {
		t.Errorf("totals.txt %q, want %q", got, want)
	}
	prompt, _ := os.ReadFile(filepath.Join(s.data, "tasks", tk.ID, "prompt.md"))
	if !strings.Contains(string(prompt), "/task/context/statement.csv") {
		t.Errorf("prompt.md does not list the attachment:\n%s", prompt)
	}

	att, err := s.client.CreateAttachmentFromWorkspace(context.Background(), service.CreateAttachmentRequest{SourcePath: "tasks/" + tk.ID + "/output/chart.png", Description: "spending by category"})
	if err != nil {
		t.Fatal(err)
	}
	onDisk, _ := os.ReadFile(filepath.Join(s.data, "tasks", tk.ID, "output", "chart.png"))
	sum := sha256.Sum256(onDisk)
	if att.Name != "chart.png" || att.Type != "image/png" || att.Size != int64(len(onDisk)) || att.SHA256 != hex.EncodeToString(sum[:]) || att.Source != "tasks/"+tk.ID+"/output/chart.png" {
		t.Errorf("attachment %+v", att)
	}
	got := filepath.Join(dir, "downloaded.png")
	s.runCLI(t, "attachments", "get", "--server", s.url, att.ID, "-o", got)
	if b, _ := os.ReadFile(got); !bytes.Equal(b, onDisk) {
		t.Errorf("downloaded %d bytes, want the chart's %d", len(b), len(onDisk))
	}
	for _, id := range []string{tk.AttachmentIDs[0], att.ID} {
		if types := s.eventTypes(t, task.AttachmentStreamID(id)); len(types) != 1 || types[0] != task.EventAttachmentCreated {
			t.Errorf("attachment %s events %v, want [attachment_created]", id, types)
		}
	}
}

// Use case 3: a script saved with save_to_shared, used by a second task
// through shared_files; a third task's different script of the same name
// is saved under a suffix, and the event says so.
func TestReusableScript(t *testing.T) {
	s := MustStart(t, nil)
	spawn := func(req service.SpawnRequest) task.Task {
		t.Helper()
		req.Agent = "command"
		tk := mustSpawn(t, s.client, req)
		s.waitSuccess(t, tk.ID, 30*time.Second)
		return tk
	}
	first := spawn(service.SpawnRequest{TaskDescription: "Write a greeting script", SaveToShared: true,
		Command: []string{"sh", "-c", `printf '#!/bin/sh\necho "hello, $1"\n' > output/greet.sh && echo done > output/notes.md`}})
	s.waitSaved(t, first.ID) // the copy follows the end
	month := time.Now().UTC().Format("2006-01")
	for _, p := range []string{"scripts/greet.sh", "outputs/" + month + "/" + first.ID + "/greet.sh", "outputs/" + month + "/" + first.ID + "/notes.md"} {
		if _, err := os.Stat(filepath.Join(s.data, "shared", p)); err != nil {
			t.Errorf("shared/%s: %v", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(s.data, "shared", "scripts", "notes.md")); err == nil {
		t.Errorf("notes.md is not a script but was copied to scripts/")
	}
	var saved task.OutputsSaved
	json.Unmarshal(s.taskEvent(t, first.ID, task.EventOutputsSaved), &saved)
	if saved.Directory != "shared/outputs/"+month+"/"+first.ID || len(saved.Files) != 3 {
		t.Errorf("outputs_saved %+v", saved)
	}

	second := spawn(service.SpawnRequest{TaskDescription: "Greet the world with the saved script", SharedFiles: []string{"scripts/greet.sh"},
		Command: []string{"sh", "-c", "sh context/greet.sh world > output/greeting.txt"}})
	res := s.wait(t, second.ID, time.Second, "greeting.txt")
	if got := res.FileContents["greeting.txt"].Content; got != "hello, world\n" {
		t.Errorf("greeting %q", got)
	}

	third := spawn(service.SpawnRequest{TaskDescription: "Another greeting script", SaveToShared: true,
		Command: []string{"sh", "-c", `printf '#!/bin/sh\necho "hi, $1"\n' > output/greet.sh`}})
	saved = s.waitSaved(t, third.ID)
	var script task.SavedFile
	for _, f := range saved.Files {
		if strings.HasPrefix(f.To, "scripts/") {
			script = f
		}
	}
	if script.To != "scripts/greet-2.sh" || !script.Renamed || script.Wanted != "scripts/greet.sh" {
		t.Errorf("the second greet.sh was saved as %+v, want scripts/greet-2.sh marked renamed", script)
	}
	if b, _ := os.ReadFile(filepath.Join(s.data, "shared", "scripts", "greet.sh")); !strings.Contains(string(b), "hello") {
		t.Errorf("the first greet.sh was overwritten: %q", b)
	}
}

// Use case 6: five uploads in one request, processed by one task; two
// share a name and both arrive.
func TestBatchOfFiveUploads(t *testing.T) {
	s := MustStart(t, nil)
	names := []string{"receipt1.txt", "receipt2.txt", "receipt3.txt", "receipt.txt", "receipt.txt"}
	i := 0
	atts, err := s.client.UploadAttachments(context.Background(), func() (string, io.Reader, error) {
		if i == len(names) {
			return "", nil, io.EOF
		}
		i++
		return names[i-1], strings.NewReader(fmt.Sprintf("total %d.00\n", i*10)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(atts) != 5 {
		t.Fatalf("%d attachments, want 5", len(atts))
	}
	var ids []string
	for _, a := range atts {
		ids = append(ids, a.ID)
	}
	tk := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "Sum the receipts", Agent: "command", AttachmentIDs: ids,
		Command: []string{"sh", "-c", `ls context > output/files.txt && cat context/*.txt | awk '{s+=$2} END{printf "%.2f\n", s}' > output/total.txt`}})
	res := s.waitSuccess(t, tk.ID, 30*time.Second, "files.txt", "total.txt")
	if got, want := res.FileContents["files.txt"].Content, "receipt-2.txt\nreceipt.txt\nreceipt1.txt\nreceipt2.txt\nreceipt3.txt\n"; got != want {
		t.Errorf("context/ holds %q, want %q", got, want)
	}
	if got := res.FileContents["total.txt"].Content; got != "150.00\n" {
		t.Errorf("total %q, want 150.00", got)
	}
}

// Bad input: each a clear 4xx, and nothing written.
func TestAttachmentBadInput(t *testing.T) {
	s := MustStart(t, func(c *config.Config) {
		c.Limits.MaxUploadBytes = mustSize(t, "1KiB")
		c.Limits.MaxSharedBytes = mustSize(t, "8KiB")
		c.Limits.MaxWriteBytes = mustSize(t, "5KiB")
	})
	ctx := context.Background()
	upload := func(files ...string) error {
		i := 0
		_, err := s.client.UploadAttachments(ctx, func() (string, io.Reader, error) {
			if i == len(files) {
				return "", nil, io.EOF
			}
			i += 2
			return files[i-2], strings.NewReader(files[i-1]), nil
		})
		return err
	}
	if err := upload("big.bin", strings.Repeat("x", 1025)); !errors.Is(err, errdefs.ErrTooLarge) || !strings.Contains(err.Error(), "1KiB") {
		t.Errorf("oversize: %v, want 413 naming the limit", err)
	}
	if err := upload("empty.txt", ""); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty: %v, want 400", err)
	}
	if err := upload("ok.txt", "fine", "big.bin", strings.Repeat("x", 2000)); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Errorf("good then oversize: %v, want 413", err)
	}
	if code, body := s.do(t, "POST", "/api/attachments", "text/plain", strings.NewReader("x")); code != 400 {
		t.Errorf("not multipart: %d %s", code, body)
	}
	if files := attachmentFiles(t, s.data); len(files) != 0 {
		t.Errorf("refused uploads left files: %v", files)
	}

	// Unknown and malformed ids.
	unknown := strings.Repeat("ab", 16)
	_, _, err := s.client.Spawn(ctx, service.SpawnRequest{TaskDescription: "x", Agent: "command", Command: []string{"true"}, AttachmentIDs: []string{unknown, "../../etc/passwd"}})
	if err == nil || !strings.Contains(err.Error(), "attachment_ids[0]") || !strings.Contains(err.Error(), "attachment_ids[1]") {
		t.Errorf("unknown and malformed ids: %v, want both named", err)
	}
	if code, _ := s.do(t, "GET", "/api/attachments/"+unknown, "", nil); code != 404 {
		t.Errorf("download unknown: %d, want 404", code)
	}
	if code, _ := s.do(t, "GET", "/api/attachments/nothex", "", nil); code != 400 {
		t.Errorf("download malformed: %d, want 400", code)
	}
	if ents, _ := os.ReadDir(filepath.Join(s.data, "tasks")); len(ents) != 0 {
		t.Errorf("a refused spawn left task directories: %v", ents)
	}

	// Paths outside the workspace or a task's output.
	tk := s.spawn(t, "make an output", "sh", "-c", "echo secret > context/x.txt; echo ok > output/ok.txt; ln -s /etc/passwd output/link")
	s.wait(t, tk.ID, 30*time.Second)
	for _, c := range []struct {
		path string
		code error
	}{
		{"../corral.db", errdefs.ErrPermissionDenied},
		{"shared/../../corral.db", errdefs.ErrPermissionDenied},
		{"tasks/" + tk.ID + "/context/x.txt", errdefs.ErrPermissionDenied},
		{"tasks/" + tk.ID + "/output/../prompt.md", errdefs.ErrPermissionDenied},
		{"tasks/" + tk.ID + "/output/link", errdefs.ErrPermissionDenied},
		{"tasks/task-nope/output/ok.txt", errdefs.ErrInvalidArgument},
		{"/etc/passwd", errdefs.ErrFailedPrecondition}, // shared/etc/passwd: a missing input file is a 422
		{"", errdefs.ErrInvalidArgument},
	} {
		_, err := s.client.CreateAttachmentFromWorkspace(ctx, service.CreateAttachmentRequest{SourcePath: c.path})
		if !errors.Is(err, c.code) {
			t.Errorf("source_path %q: %v, want %v", c.path, err, c.code)
		}
	}
	if files := attachmentFiles(t, s.data); len(files) != 0 {
		t.Errorf("refused attachments left files: %v", files)
	}

	// Quotas: one write over max_write_bytes, then shared/ over its total.
	if _, err := s.client.WriteWorkspace(ctx, "data/a.txt", bytes.Repeat([]byte("x"), 6<<10)); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Errorf("write over max_write_bytes: %v, want 413", err)
	}
	s.mustWriteWorkspace(t, "data/a.txt", bytes.Repeat([]byte("x"), 5<<10))
	_, err = s.client.WriteWorkspace(ctx, "data/b.txt", bytes.Repeat([]byte("x"), 4<<10))
	if !errors.Is(err, errdefs.ErrResourceExhausted) || errors.Is(err, errdefs.ErrTooLarge) || !strings.Contains(err.Error(), "limits.max_shared_bytes") {
		t.Errorf("write past the shared/ quota: %v, want 429 naming limits.max_shared_bytes", err)
	}
	if _, err := os.Stat(filepath.Join(s.data, "shared", "data", "b.txt")); err == nil {
		t.Errorf("a write past the quota was written")
	}
}

func mustSizeTB(t testing.TB, v string) config.Size {
	t.Helper()
	n, err := config.ParseSize(v)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// genReader yields n bytes of a repeating pattern, generated as read.
type genReader struct{ n, off int64 }

func (g *genReader) Read(p []byte) (int, error) {
	if g.off >= g.n {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), g.n-g.off)]
	for i := range p {
		p[i] = byte((g.off + int64(i)) * 7 % 251)
	}
	g.off += int64(len(p))
	return len(p), nil
}

// vmHWM returns the process's peak resident set size in bytes.
func vmHWM(tb testing.TB) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	tb.Fatal("no VmHWM in /proc/self/status")
	return 0
}

// BenchmarkAttachmentLargeFile uploads and downloads a 1 GiB attachment
// through the real server and client, in this one process, and reports the
// peak RSS growth: streaming keeps it flat, whatever the size.
//
//	go test -tags integration -run '^$' -bench AttachmentLargeFile -benchtime 1x ./internal/app
func BenchmarkAttachmentLargeFile(b *testing.B) {
	const size = 1 << 30
	s := startServer(b, []string{}, nil, func(c *config.Config) {
		c.Limits.MaxUploadBytes = mustSizeTB(b, "2GiB")
		c.Limits.MaxUploadRequestBytes = mustSizeTB(b, "2GiB")
	})
	ctx := context.Background()
	// Reset the peak (Linux: "5" to clear_refs resets VmHWM to the current RSS).
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Skipf("cannot reset the peak RSS: %v", err)
	}
	base := vmHWM(b)
	b.SetBytes(2 * size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		sent := false
		atts, err := s.client.UploadAttachments(ctx, func() (string, io.Reader, error) {
			if sent {
				return "", nil, io.EOF
			}
			sent = true
			return "big.bin", &genReader{n: size}, nil
		})
		if err != nil {
			b.Fatal(err)
		}
		m, rc, err := s.client.OpenAttachment(ctx, atts[0].ID)
		if err != nil {
			b.Fatal(err)
		}
		h := sha256.New()
		n, err := io.Copy(h, rc)
		rc.Close()
		if err != nil || n != size || hex.EncodeToString(h.Sum(nil)) != atts[0].SHA256 || m.SHA256 != atts[0].SHA256 {
			b.Fatalf("downloaded %d bytes (%v), sha256 mismatch or short", n, err)
		}
		os.RemoveAll(filepath.Join(s.data, "attachments", atts[0].ID[:2]))
	}
	b.StopTimer()
	peak := vmHWM(b)
	b.ReportMetric(float64(peak-base)/(1<<20), "peak-RSS-growth-MiB")
	b.ReportMetric(float64(peak)/(1<<20), "peak-RSS-MiB")
}
