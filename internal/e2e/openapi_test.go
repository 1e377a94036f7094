//go:build integration

package e2e_test

import (
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/httpapi/openapitest"
)

// TestOpenAPIResponses checks a real server's answers against the OpenAPI
// document's schemas: a task run by the command agent on the local
// runtime (spawn, get, list, result, logs, events, files, cancel), a
// session (create, get, list, an exec's whole stream, a detached one,
// history, fork, suspend, resume, delete), health, tools, attachments,
// workspaces, documents, skills and error bodies. A field
// renamed on either side fails it: the schemas of fixed structs allow no
// other properties.
func TestOpenAPIResponses(t *testing.T) {
	t.Parallel()
	s := MustStart(t, withExec)
	doc := openapitest.Load(t)
	// call sends a request to path (the template the document names it
	// by, with its parameters filled in by the arguments) and checks the
	// answer against the document.
	call := func(method, template, path string, body io.Reader, contentType string, wantStatus int) []byte {
		t.Helper()
		req, err := http.NewRequest(method, s.url+path, body)
		if err != nil {
			t.Fatal(err)
		}
		if s.token != "" {
			req.Header.Set("Authorization", "Bearer "+s.token)
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != wantStatus {
			t.Errorf("%s %s: %d %s, want %d", method, path, resp.StatusCode, b, wantStatus)
		}
		doc.Check(t, method, template, resp, b)
		return b
	}
	js := func(v string) io.Reader { return strings.NewReader(v) }
	const JSON = "application/json"

	call("GET", "/healthz", "/healthz", nil, "", 200)
	call("GET", "/api/health", "/api/health", nil, "", 200)
	call("GET", "/api/openapi.json", "/api/openapi.json", nil, "", 200)
	call("GET", "/api/tools", "/api/tools", nil, "", 200)
	call("GET", "/metrics", "/metrics", nil, "", 200)

	// A task, to its end.
	var spawned struct {
		TaskID string `json:"task_id"`
	}
	json.Unmarshal(call("POST", "/api/tasks", "/api/tasks", js(`{"task_description":"write a file","command":["sh","-c","echo hello > output/hello.txt; echo done"],"labels":{"who":"openapi"}}`), JSON, 201), &spawned)
	id := spawned.TaskID
	call("GET", "/api/tasks/{id}/result", "/api/tasks/"+id+"/result?wait=60s&include_file_contents=hello.txt", nil, "", 200)
	call("GET", "/api/tasks/{id}", "/api/tasks/"+id, nil, "", 200)
	call("GET", "/api/tasks", "/api/tasks?limit=5", nil, "", 200)
	call("GET", "/api/tasks/{id}/events", "/api/tasks/"+id+"/events", nil, "", 200)
	call("GET", "/api/events", "/api/events", nil, "", 200)
	call("GET", "/api/tasks/{id}/logs", "/api/tasks/"+id+"/logs", nil, "", 200)
	call("GET", "/api/tasks/{id}/files/{path}", "/api/tasks/"+id+"/files/hello.txt", nil, "", 200)
	// The same idempotency key twice: the second answers the first's task.
	call("POST", "/api/tasks", "/api/tasks", js(`{"task_description":"once","command":["true"],"idempotency_key":"openapi-once"}`), JSON, 201)
	call("POST", "/api/tasks", "/api/tasks", js(`{"task_description":"once","command":["true"],"idempotency_key":"openapi-once"}`), JSON, 200)
	// A task cancelled while it runs.
	json.Unmarshal(call("POST", "/api/tasks", "/api/tasks", js(`{"task_description":"sleep","command":["sleep","60"],"conversation_id":"conv-openapi"}`), JSON, 201), &spawned)
	call("POST", "/api/tasks/{id}/cancel", "/api/tasks/"+spawned.TaskID+"/cancel", js(`{}`), JSON, 200)
	call("GET", "/api/conversations/{id}/events", "/api/conversations/conv-openapi/events", nil, "", 200)
	call("POST", "/api/exec", "/api/exec", js(`{"command":"echo out; echo err >&2"}`), JSON, 200)

	// Error bodies: a plain one, one with fields, one of a bad token.
	call("GET", "/api/tasks/{id}", "/api/tasks/task-00000000000000000000000000", nil, "", 404)
	// The command agent: the default one (claude) has no credentials here,
	// a failed precondition (422), which the next call shows.
	call("POST", "/api/tasks", "/api/tasks", js(`{"task_description":"","timeout_minutes":100000,"agent":"command"}`), JSON, 400)
	call("POST", "/api/tasks", "/api/tasks", js(`{"task_description":"x"}`), JSON, 422)
	call("POST", "/api/tasks", "/api/tasks", js(`{}`), "text/plain", 415)

	// A session, with an exec's stream from its first line to its last.
	var created struct {
		SessionID string `json:"session_id"`
	}
	json.Unmarshal(call("POST", "/api/sessions", "/api/sessions", js(`{"labels":{"who":"openapi"}}`), JSON, 201), &created)
	sid := created.SessionID
	call("GET", "/api/sessions/{id}", "/api/sessions/"+sid, nil, "", 200)
	call("GET", "/api/sessions", "/api/sessions", nil, "", 200)
	stream := call("POST", "/api/sessions/{id}/exec", "/api/sessions/"+sid+"/exec", js(`{"command":"echo one; echo two >&2; exit 3"}`), JSON, 200)
	if lines := strings.Split(strings.TrimSpace(string(stream)), "\n"); len(lines) < 3 || !strings.Contains(lines[0], `"started"`) || !strings.Contains(lines[len(lines)-1], `"exit"`) {
		t.Errorf("exec stream %s: want started, output, exit", stream)
	}
	var started struct {
		ExecID string `json:"exec_id"`
	}
	json.Unmarshal(call("POST", "/api/sessions/{id}/exec", "/api/sessions/"+sid+"/exec", js(`{"command":["true"],"detach":true}`), JSON, 202), &started)
	call("GET", "/api/sessions/{id}/execs/{exec_id}", "/api/sessions/"+sid+"/execs/"+started.ExecID, nil, "", 200)
	call("GET", "/api/sessions/{id}/history", "/api/sessions/"+sid+"/history", nil, "", 200)
	call("POST", "/api/sessions/{id}/fork", "/api/sessions/"+sid+"/fork", js(`{"count":1}`), JSON, 201)
	call("POST", "/api/sessions/{id}/suspend", "/api/sessions/"+sid+"/suspend", js(`{}`), JSON, 200)
	call("POST", "/api/sessions/{id}/resume", "/api/sessions/"+sid+"/resume", js(`{}`), JSON, 200)
	call("DELETE", "/api/sessions/{id}", "/api/sessions/"+sid, nil, "", 200)

	// Attachments.
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	fw, _ := mw.CreateFormFile("file", "notes.txt")
	fw.Write([]byte("some notes\n"))
	mw.Close()
	var att struct {
		AttachmentID string `json:"attachment_id"`
	}
	json.Unmarshal(call("POST", "/api/attachments", "/api/attachments", &form, mw.FormDataContentType(), 201), &att)
	call("GET", "/api/attachments/{id}", "/api/attachments/"+att.AttachmentID, nil, "", 200)
	call("POST", "/api/gc", "/api/gc?dry_run=1", js(`{}`), JSON, 200)

	// Workspaces: a named one, and the shared one.
	call("POST", "/api/workspaces", "/api/workspaces", js(`{"name":"openapi","init_git":true}`), JSON, 201)
	call("GET", "/api/workspaces", "/api/workspaces", nil, "", 200)
	call("GET", "/api/workspaces/{name}/files/{path}", "/api/workspaces/openapi/files/", nil, "", 200)
	call("PUT", "/api/workspace/{path}", "/api/workspace/notes/a.txt", js("a note\n"), "application/octet-stream", 200)
	call("GET", "/api/workspace/{path}", "/api/workspace/notes/a.txt", nil, "", 200)
	call("GET", "/api/workspace/{path}", "/api/workspace/?recursive=true", nil, "", 200)

	// The library.
	call("POST", "/api/documents", "/api/documents", js(`{"title":"A note","content":"openapi checks answers","source_type":"note"}`), JSON, 201)
	call("GET", "/api/documents", "/api/documents?q=openapi", nil, "", 200)
	call("POST", "/api/documents/export", "/api/documents/export", js(`{"query":"openapi","destination_dir":"exported"}`), JSON, 200)
	call("POST", "/api/skills", "/api/skills", js(`{"name":"openapi-skill","description":"checks answers","instructions":"Check each answer."}`), JSON, 201)
	call("GET", "/api/skills/{name}", "/api/skills/openapi-skill", nil, "", 200)
	call("GET", "/api/skills", "/api/skills", nil, "", 200)
	// Notifications are off: the deliveries' routes say so.
	call("GET", "/api/deliveries", "/api/deliveries", nil, "", 501)
}
