//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// conversationReports returns the reports on conversation conv's stream.
func conversationReports(t *testing.T, c interface {
	Events(context.Context, service.EventsRequest, func(eventstore.Event) error) error
}, conv string) map[string][]task.WorkspaceTaskReport {
	t.Helper()
	out := map[string][]task.WorkspaceTaskReport{}
	err := c.Events(context.Background(), service.EventsRequest{ConversationID: conv}, func(e eventstore.Event) error {
		var r task.WorkspaceTaskReport
		if err := json.Unmarshal(e.Data, &r); err != nil {
			return err
		}
		out[e.Type] = append(out[e.Type], r)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestWorkspaceTaskReports: a workspace task's start and end land once
// each on its origin conversation's stream (workspace_task_spawned, then
// the end with the origin and the result), and the end
// reaches a notification receiver that verifies its signature; a server
// killed with SIGKILL mid-task still reports the task's real end, once.
func TestWorkspaceTaskReports(t *testing.T) {
	testenv.RequireBwrap(t)
	requireReceiver(t)
	t.Parallel()
	setup := mustNotifySetup(t, "")
	data, cfgFile, out := setup.data, setup.cfgFile, setup.out
	startReceiver(t, setup.port, setup.secret, out)
	srv := startNotifyServer(t, data, cfgFile)
	ctx := context.Background()
	if _, err := srv.client.CreateProject(ctx, service.CreateProjectRequest{Name: "site"}); err != nil {
		t.Fatal(err)
	}
	spawn := func(script string) string {
		tk := mustSpawn(t, srv.client, service.SpawnRequest{TaskDescription: "build the site", Workspace: "site", Agent: "command",
			Command: []string{"sh", "-c", script}, ConversationID: "chat-7", OriginWorkspace: "assistant-home", UserName: "alice"})
		return tk.ID
	}
	ok := spawn("echo built > index.html")
	bad := spawn("exit 3")
	for _, id := range []string{ok, bad} {
		if _, err := srv.client.Result(ctx, service.ResultRequest{TaskID: id, Wait: 60 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
	var reps map[string][]task.WorkspaceTaskReport
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		reps = conversationReports(t, srv.client, "chat-7")
		if len(reps[task.EventWorkspaceTaskCompleted])+len(reps[task.EventWorkspaceTaskFailed]) == 2 || time.Now().After(deadline) {
			break
		}
	}
	if c := reps[task.EventWorkspaceTaskCompleted]; len(c) != 1 || c[0].TaskID != ok || c[0].Workspace != "site" || c[0].OriginWorkspace != "assistant-home" || c[0].ConversationID != "chat-7" {
		t.Errorf("completed reports %+v, want task %s with its origin", c, ok)
	}
	if f := reps[task.EventWorkspaceTaskFailed]; len(f) != 1 || f[0].TaskID != bad || f[0].Status != task.Failed {
		t.Errorf("failed reports %+v, want task %s", f, bad)
	}
	if s := reps[task.EventWorkspaceTaskSpawned]; len(s) != 2 || s[0].TaskID != ok || s[1].TaskID != bad || s[0].ConversationID != "chat-7" {
		t.Errorf("spawned reports %+v, want tasks %s and %s, in order", s, ok, bad)
	}

	// The receiver got both, signed, with the origin in the report.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		raw, _ := os.ReadFile(out)
		n := strings.Count(string(raw), `"event_type":"workspace_task_`)
		if n >= 2 {
			if strings.Contains(string(raw), `"verified":false`) || !strings.Contains(string(raw), `"origin_workspace":"assistant-home"`) {
				t.Errorf("receiver lines: %s", raw)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the receiver has %d workspace task reports: %s", n, raw)
		}
	}

	// Killed mid-task: the report of the task's real end comes once.
	mid := spawn("while [ ! -e go ]; do sleep 0.05; done; echo done > mid.txt")
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if tk, _ := srv.client.Get(ctx, mid); tk.Status == task.Running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the task never ran")
		}
	}
	srv.kill()
	if err := os.WriteFile(filepath.Join(data, "projects", "site", "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	srv = startNotifyServer(t, data, cfgFile)
	if res, err := srv.client.Result(ctx, service.ResultRequest{TaskID: mid, Wait: 60 * time.Second}); err != nil || res.Status != task.Success {
		t.Fatalf("the task across the restart: %+v, %v", res.Status, err)
	}
	srv.kill()
	srv = startNotifyServer(t, data, cfgFile) // a second catch-up must not report again
	time.Sleep(time.Second)
	reps = conversationReports(t, srv.client, "chat-7")
	for _, typ := range []string{task.EventWorkspaceTaskSpawned, task.EventWorkspaceTaskCompleted} {
		n := 0
		for _, r := range reps[typ] {
			if r.TaskID == mid {
				n++
			}
		}
		if n != 1 {
			t.Errorf("the task killed mid-run has %d %s reports, want one", n, typ)
		}
	}
}
