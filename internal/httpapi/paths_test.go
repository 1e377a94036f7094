package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/library"
	"github.com/corral-dev/corral/internal/orchestrator"
	"github.com/corral-dev/corral/internal/orchestrator/orchestratortest"
	"github.com/corral-dev/corral/internal/webhook"
	"github.com/corral-dev/corral/internal/workspace"
)

// orchBackend is the real orchestrator and library (orchestratortest).
type orchBackend struct {
	*orchestrator.Orchestrator
	*library.Library
}

func (orchBackend) Stats() Stats { return Stats{} }

// WorkerComplete: no worker reports to this backend.
func (orchBackend) WorkerComplete(context.Context, webhook.Signed) (string, error) {
	return "", errdefs.ErrNotImplemented
}

// MustServeWorkspace serves a real orchestrator's workspace over the real
// handler and returns the server's URL, a client and shared/'s host path.
func MustServeWorkspace(t *testing.T) (string, *Client, string) {
	t.Helper()
	f := orchestratortest.New(t, nil)
	hs := serveAt(t, "127.0.0.1:0", orchBackend{f.Orch, f.Library}, Options{})
	return hs.URL, NewClient(hs.URL, ""), f.Data.HostPath(workspace.DirShared)
}

// sendRaw sends a request and returns its status and error message.
func sendRaw(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	status, body := roundTrip(t, req)
	var eb errorBody
	json.Unmarshal([]byte(body), &eb)
	return status, eb.Error
}

// mustHold fails unless shared/ holds exactly the directories Open makes
// and the names in also.
func mustHold(t *testing.T, shared string, also ...string) {
	t.Helper()
	ents, err := os.ReadDir(shared)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"scripts": true, "data": true, "context": true, "skills": true, "outputs": true}
	for _, n := range also {
		want[n] = true
	}
	for _, e := range ents {
		if !want[e.Name()] {
			t.Errorf("shared/ holds %q", e.Name())
		}
	}
}

// An absolute path is refused, for writes and reads alike, instead of
// being taken as relative to shared/; /workspace/shared/... still names
// a shared file, as workers see it.
func TestWorkspaceAbsolutePathsRefused(t *testing.T) {
	url, cl, shared := MustServeWorkspace(t)
	const want = "absolute paths are not allowed; give a path relative to shared/"
	for _, c := range []struct{ method, path, body string }{
		{"PUT", "/api/workspace/%2Fabs.txt", "x"},
		{"PUT", "/api/workspace/%2Fdata%2Fabs.txt", "x"},
		{"GET", "/api/workspace/%2Fetc%2Fpasswd", ""},
		{"GET", "/api/workspace/%2Fdata", ""},
		{"POST", "/api/tools/write_workspace", `{"path":"/abs.txt","content":"x"}`},
		{"POST", "/api/tools/read_workspace", `{"path":"/etc/passwd"}`},
		{"POST", "/api/tools/list_workspace", `{"path":"/data"}`},
	} {
		code, msg := sendRaw(t, c.method, url+c.path, c.body)
		if code != http.StatusBadRequest || !strings.Contains(msg, want) {
			t.Errorf("%s %s %s: %d %q, want 400 saying %q", c.method, c.path, c.body, code, msg, want)
		}
	}
	if _, err := cl.WriteWorkspace(context.Background(), "/abs.txt", []byte("x")); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("client write of /abs.txt: %v, want invalid argument", err)
	}
	mustHold(t, shared)
	if _, err := cl.WriteWorkspace(context.Background(), "/workspace/shared/data/in.csv", []byte("a,b\n")); err != nil {
		t.Errorf("write of /workspace/shared/data/in.csv: %v", err)
	}
	if f, err := cl.ReadWorkspace(context.Background(), "data/in.csv"); err != nil || f.Content != "a,b\n" {
		t.Errorf("read back data/in.csv: %+v, %v", f, err)
	}
	if ents, err := cl.ListWorkspace(context.Background(), "/", false); err != nil || len(ents) != 5 {
		t.Errorf("list of /: %v, %v; want the root's five directories", ents, err)
	}
}

// A name with a control character (C0, DEL, C1) or that is not UTF-8 is
// refused on every write, by URL and by tool; such a name a worker made
// can still be listed and read.
func TestWorkspaceControlCharactersRefused(t *testing.T) {
	url, cl, shared := MustServeWorkspace(t)
	for _, p := range []string{"a%0Ab.txt", "a%0Db.txt", "tab%09.txt", "esc%1B%5B2J.txt", "del%7F.txt", "c1%C2%85.txt", "c1%C2%9B.txt", "bad%FF.txt", "dir%0A%2Fx.txt", "data/a%0Ab.txt"} {
		code, msg := sendRaw(t, "PUT", url+"/api/workspace/"+p, "x")
		if code != http.StatusBadRequest || !strings.Contains(msg, "path: name") {
			t.Errorf("PUT %s: %d %q, want 400 naming the path", p, code, msg)
		}
	}
	for _, p := range []string{`a\nb.txt`, `x\u001b.txt`, `c1\u0085.txt`, `dir\u007f/x.txt`} {
		code, msg := sendRaw(t, "POST", url+"/api/tools/write_workspace", `{"path":"`+p+`","content":"x"}`)
		if code != http.StatusBadRequest || !strings.Contains(msg, "control character") {
			t.Errorf("write_workspace %s: %d %q, want 400 naming the control character", p, code, msg)
		}
	}
	mustHold(t, shared)
	if ents, _ := os.ReadDir(filepath.Join(shared, "data")); len(ents) != 0 {
		t.Errorf("shared/data holds %v", ents)
	}

	// A worker's own name, saved to shared/ before this check existed.
	if err := os.WriteFile(filepath.Join(shared, "data", "w\nx.txt"), []byte("worker"), 0o644); err != nil {
		t.Fatal(err)
	}
	ents, err := cl.ListWorkspace(context.Background(), "data", false)
	if err != nil || len(ents) != 1 || ents[0].Path != "data/w\nx.txt" {
		t.Errorf("list of data: %+v, %v", ents, err)
	}
	if f, err := cl.ReadWorkspace(context.Background(), "data/w\nx.txt"); err != nil || f.Content != "worker" {
		t.Errorf("read of a worker's name: %+v, %v", f, err)
	}
}

// A path over PATH_MAX (4096 bytes) or with a name over NAME_MAX (255)
// answers 400 "too long", through the real handler and HTTP server, not
// 404 or 500; so does one far longer, up to what the HTTP server reads.
func TestWorkspacePathTooLong(t *testing.T) {
	url, _, shared := MustServeWorkspace(t)
	for _, c := range []struct{ name, path, want string }{
		{"4200-byte name", strings.Repeat("a", 4200), "path too long: 4200 bytes, over the limit of 4096"},
		{"4200-byte path", strings.Repeat("abcdefghi/", 420), "path too long: 4200 bytes, over the limit of 4096"},
		{"256-byte name", "data/" + strings.Repeat("n", 256), "name too long"},
		{"100 KiB path", strings.Repeat("d/", 50<<10), "path too long: 102400 bytes"},
	} {
		for _, rq := range []struct{ method, path, body string }{
			{"GET", "/api/workspace/" + c.path, ""},
			{"PUT", "/api/workspace/" + c.path, "x"},
			{"POST", "/api/tools/read_workspace", `{"path":"` + c.path + `"}`},
			{"POST", "/api/tools/write_workspace", `{"path":"` + c.path + `","content":"x"}`},
		} {
			code, msg := sendRaw(t, rq.method, url+rq.path, rq.body)
			if code != http.StatusBadRequest || !strings.Contains(msg, c.want) {
				t.Errorf("%s %s with a %s: %d %q, want 400 saying %q", rq.method, rq.path[:20], c.name, code, msg, c.want)
			}
		}
	}
	mustHold(t, shared)
}
