package tools

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

func TestFitContents(t *testing.T) {
	res := service.Result{Task: task.Task{ID: "task-1"}, FileContents: map[string]service.File{
		"a.txt": {Path: "a.txt", Size: 6, Encoding: "utf-8", Content: "aaaaaa"},
		"b.txt": {Path: "b.txt", Size: 8, Encoding: "utf-8", Content: "éééé"}, // 2 bytes a rune
		"c.bin": {Path: "c.bin", Size: 6, Encoding: "base64", Content: "AAECAwQF"},
	}}
	fitContents(&res, []string{"a.txt", "b.txt", "c.bin"}, 11)
	a, b, c := res.FileContents["a.txt"], res.FileContents["b.txt"], res.FileContents["c.bin"]
	if a.Content != "aaaaaa" || a.Truncated || a.Note != "" {
		t.Errorf("a.txt within the budget changed: %+v", a)
	}
	if b.Content != "éé" || !b.Truncated || !utf8.ValidString(b.Content) {
		t.Errorf("b.txt: %+v, want cut to 4 bytes at a rune boundary", b)
	}
	if want := "content cut at 4 of 8 bytes; the whole file: GET /api/tasks/task-1/files/b.txt"; b.Note != want {
		t.Errorf("b.txt note %q, want %q", b.Note, want)
	}
	if c.Content != "" || !c.Truncated || !strings.Contains(c.Note, "/api/tasks/task-1/files/c.bin") {
		t.Errorf("c.bin past the budget: %+v", c)
	}
}

func TestCutBase64(t *testing.T) {
	if got := cut("AAECAwQF", "base64", 7); got != "AAEC" {
		t.Errorf("cut base64 at 7: %q, want a whole quantum AAEC", got)
	}
	if got := contentBytes(service.File{Encoding: "base64", Content: "AAE="}); got != 2 {
		t.Errorf("contentBytes of AAE= is %d, want 2", got)
	}
}

// A catalogue over a Set without sessions answers workspace_exec with
// ErrNotImplemented, before anything runs, as the API does.
func TestWorkspaceExecWhereSessionsAreOff(t *testing.T) {
	_, err := New(service.Set{}, Limits{}).Call(context.Background(), "workspace_exec", json.RawMessage(`{"session_id":"sess-x","command":"true"}`))
	if !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("workspace_exec without sessions: %v, want ErrNotImplemented", err)
	}
	_, err = NewSession(nil, "sess-x").Call(context.Background(), "workspace_exec", json.RawMessage(`{"command":"true"}`))
	if !errors.Is(err, errdefs.ErrNotImplemented) {
		t.Errorf("a session's workspace_exec without sessions: %v, want ErrNotImplemented", err)
	}
}
