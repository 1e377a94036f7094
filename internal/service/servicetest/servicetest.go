// Package servicetest checks that the implementations of the service
// contracts answer as the contracts say, and alike: Run drives the same
// calls of the task and library contracts against each service.Set it is
// given (the orchestrator and library in process, httpapi.Client over the
// HTTP API), RunSessions those of the session contract (the session
// manager, and the client), and each compares what they say, error
// classes included.
package servicetest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// Run runs the task and library contracts' checks against each
// implementation; newImpl returns a fresh one for each check, with no
// scheduler (tasks stay queued).
func Run(t *testing.T, impls map[string]func(*testing.T) service.Set) {
	checks := map[string]func(*testing.T, service.Set){
		"Workspace":   checkWorkspace,
		"Tasks":       checkTasks,
		"Attachments": checkAttachments,
		"Skills":      checkSkills,
		"Execute":     checkExecute,
		"EventsNow":   checkEventsAfterNow,
	}
	for impl, newImpl := range impls {
		for name, check := range checks {
			t.Run(impl+"/"+name, func(t *testing.T) { check(t, newImpl(t)) })
		}
	}
}

// wantClass fails unless err is of class want.
func wantClass(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: %v, want an error of class %v", what, err, want)
	}
}

func checkWorkspace(t *testing.T, svc service.Set) {
	ctx := context.Background()
	e, err := svc.Library.WriteWorkspace(ctx, "data/a.csv", []byte("a,b\n1,2\n"))
	if err != nil || e.Path != "data/a.csv" || e.Size != 8 {
		t.Fatalf("WriteWorkspace: %+v, %v", e, err)
	}
	f, err := svc.Library.ReadWorkspace(ctx, "/workspace/shared/data/a.csv")
	if err != nil || f.Content != "a,b\n1,2\n" || f.Size != 8 {
		t.Errorf("ReadWorkspace: %+v, %v", f, err)
	}
	ents, err := svc.Library.ListWorkspace(ctx, "data", false)
	if err != nil || len(ents) != 1 || ents[0].Path != "data/a.csv" {
		t.Errorf("ListWorkspace(data): %+v, %v", ents, err)
	}
	_, err = svc.Library.ReadWorkspace(ctx, "data/none.csv")
	wantClass(t, "read of a missing file", err, errdefs.ErrNotFound)
	_, err = svc.Library.WriteWorkspace(ctx, "../escape", []byte("x"))
	wantClass(t, "write outside shared/", err, errdefs.ErrPermissionDenied)
	_, err = svc.Library.WriteWorkspace(ctx, "/abs.txt", []byte("x"))
	wantClass(t, "write of an absolute path", err, errdefs.ErrInvalidArgument)
	_, err = svc.Library.ListWorkspace(ctx, "data/a.csv", false)
	wantClass(t, "listing a file", err, errdefs.ErrFailedPrecondition)
}

func checkTasks(t *testing.T, svc service.Set) {
	ctx := context.Background()
	req := service.SpawnRequest{TaskDescription: "count", Agent: task.AgentCommand, Command: []string{"true"}, IdempotencyKey: "k1", Labels: map[string]string{"team": "a"}}
	tk, existing, err := svc.Tasks.Spawn(ctx, req)
	if err != nil || existing || tk.Status != task.Queued || tk.Agent != task.AgentCommand {
		t.Fatalf("Spawn: %+v existing %v, %v", tk, existing, err)
	}
	again, existing, err := svc.Tasks.Spawn(ctx, req)
	if err != nil || !existing || again.ID != tk.ID {
		t.Errorf("Spawn with the same idempotency key: %s existing %v, %v; want %s again", again.ID, existing, err, tk.ID)
	}
	req.TaskDescription = "another"
	_, _, err = svc.Tasks.Spawn(ctx, req)
	wantClass(t, "the same key with other arguments", err, errdefs.ErrConflict)
	_, _, err = svc.Tasks.Spawn(ctx, service.SpawnRequest{TaskDescription: "x", Agent: task.AgentCommand, Command: []string{"true"}, TimeoutMinutes: new(500)})
	wantClass(t, "Spawn with a bad timeout", err, errdefs.ErrInvalidArgument)

	got, err := svc.Tasks.Get(ctx, tk.ID)
	if err != nil || got.ID != tk.ID || got.Description != "count" || got.Labels["team"] != "a" {
		t.Errorf("Get: %+v, %v", got, err)
	}
	_, err = svc.Tasks.Get(ctx, "task-00000000000000000000000000")
	wantClass(t, "Get of an unknown task", err, errdefs.ErrNotFound)
	_, err = svc.Tasks.Get(ctx, "../etc")
	wantClass(t, "Get of a malformed id", err, errdefs.ErrInvalidArgument)
	page, err := svc.Tasks.List(ctx, service.ListRequest{Status: string(task.Queued)})
	if err != nil || len(page.Tasks) != 1 || page.Tasks[0].ID != tk.ID {
		t.Errorf("List(queued): %+v, %v", page, err)
	}
	res, err := svc.Tasks.Result(ctx, service.ResultRequest{TaskID: tk.ID})
	if err != nil || res.Done || res.Status != task.Queued {
		t.Errorf("Result of a queued task: done %v status %s, %v", res.Done, res.Status, err)
	}

	var prompt bytes.Buffer
	if err := svc.Tasks.Logs(ctx, service.LogsRequest{TaskID: tk.ID, Stream: "prompt"}, &prompt); err != nil || !bytes.Contains(prompt.Bytes(), []byte("count")) {
		t.Errorf("Logs(prompt): %q, %v; want prompt.md with the description", prompt.String(), err)
	}
	err = svc.Tasks.Logs(ctx, service.LogsRequest{TaskID: tk.ID, Stream: "status.json"}, io.Discard)
	wantClass(t, "Logs of another file", err, errdefs.ErrInvalidArgument)

	cancelled, err := svc.Tasks.Cancel(ctx, tk.ID)
	if err != nil || cancelled.Status != task.Cancelled {
		t.Fatalf("Cancel: %+v, %v", cancelled, err)
	}
	res, err = svc.Tasks.Result(ctx, service.ResultRequest{TaskID: tk.ID, Wait: time.Second})
	if err != nil || !res.Done || res.Status != task.Cancelled {
		t.Errorf("Result after cancel: done %v status %s, %v", res.Done, res.Status, err)
	}
	var types []string
	if err := svc.Tasks.Events(ctx, service.EventsRequest{TaskID: tk.ID}, func(e eventstore.Event) error {
		types = append(types, e.Type)
		if e.CorrelationID == "" {
			t.Errorf("event %s has no correlation id", e.Type)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// A queued task ends at once: nothing runs to be asked to stop.
	if !slices.Equal(types, []string{task.EventCreated, task.EventQueued, task.EventCompleted}) {
		t.Errorf("events %v", types)
	}
}

// checkEventsAfterNow checks that a stream following from AfterNow skips
// what is already recorded and delivers what comes after.
func checkEventsAfterNow(t *testing.T, svc service.Set) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	spawn := func(desc string) task.Task {
		tk, _, err := svc.Tasks.Spawn(ctx, service.SpawnRequest{TaskDescription: desc, Agent: task.AgentCommand, Command: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		return tk
	}
	old := spawn("before")
	var none []eventstore.Event
	if err := svc.Tasks.Events(ctx, service.EventsRequest{After: service.AfterNow}, func(e eventstore.Event) error {
		none = append(none, e)
		return nil
	}); err != nil || len(none) != 0 {
		t.Errorf("Events after now, not followed: %d events, %v; want none", len(none), err)
	}
	first := make(chan eventstore.Event, 1)
	fctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- svc.Tasks.Events(fctx, service.EventsRequest{After: service.AfterNow, Follow: true}, func(e eventstore.Event) error {
			select {
			case first <- e:
			default:
			}
			return nil
		})
	}()
	// The stream may start after a spawn: spawn until one shows, each of
	// them after the old task.
	var got eventstore.Event
	for got.ID == "" {
		spawn("after")
		select {
		case got = <-first:
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("no event after now")
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Errorf("Events followed: %v", err)
	}
	if got.StreamID == task.StreamID(old.ID) {
		t.Errorf("the stream after now began with %s of the task spawned before", got.Type)
	}
}

// checkExecute checks code_execute's refusals, which come before anything
// runs (the fixture runs no sandbox).
func checkExecute(t *testing.T, svc service.Set) {
	ctx := context.Background()
	_, err := svc.Tasks.Execute(ctx, service.ExecRequest{Command: "  "})
	wantClass(t, "Execute of a blank command", err, errdefs.ErrInvalidArgument)
	_, err = svc.Tasks.Execute(ctx, service.ExecRequest{Command: "true", TimeoutSeconds: 301})
	wantClass(t, "Execute with a timeout over 300 s", err, errdefs.ErrInvalidArgument)
	_, err = svc.Tasks.Execute(ctx, service.ExecRequest{Command: "true", WorkingDir: "relative"})
	wantClass(t, "Execute in a relative directory", err, errdefs.ErrInvalidArgument)
	_, err = svc.Tasks.Execute(ctx, service.ExecRequest{Command: "true", Image: "python:3"})
	wantClass(t, "Execute with an image on local", err, errdefs.ErrFailedPrecondition)
}

func checkAttachments(t *testing.T, svc service.Set) {
	ctx := context.Background()
	files := []struct{ name, content string }{{"notes.json", `{"a": 1}`}, {"report.md", "# Report\n"}}
	i := 0
	atts, err := svc.Library.UploadAttachments(ctx, func() (string, io.Reader, error) {
		if i == len(files) {
			return "", nil, io.EOF
		}
		f := files[i]
		i++
		return f.name, bytes.NewReader([]byte(f.content)), nil
	})
	if err != nil || len(atts) != 2 {
		t.Fatalf("UploadAttachments: %+v, %v", atts, err)
	}
	for k, a := range atts {
		m, rc, err := svc.Library.OpenAttachment(ctx, a.ID)
		if err != nil {
			t.Errorf("OpenAttachment(%s): %v", a.ID, err)
			continue
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if string(b) != files[k].content || m.Name != files[k].name || m.Size != int64(len(files[k].content)) {
			t.Errorf("attachment %d: %+v %q", k, m, b)
		}
	}
	_, _, err = svc.Library.OpenAttachment(ctx, "0123456789abcdef0123456789abcdef")
	wantClass(t, "OpenAttachment of an unknown id", err, errdefs.ErrNotFound)
}

func checkSkills(t *testing.T, svc service.Set) {
	ctx := context.Background()
	req := service.CreateSkillRequest{Name: "csv-totals", Description: "Total a CSV column.", Instructions: "Run totals.py."}
	d, err := svc.Library.CreateSkill(ctx, req)
	if err != nil || d.Name != "csv-totals" || d.Path != "skills/csv-totals/SKILL.md" {
		t.Fatalf("CreateSkill: %+v, %v", d, err)
	}
	_, err = svc.Library.CreateSkill(ctx, req)
	wantClass(t, "CreateSkill of a taken name", err, errdefs.ErrAlreadyExists)
	list, err := svc.Library.ListSkills(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "csv-totals" {
		t.Errorf("ListSkills: %+v, %v", list, err)
	}
	got, err := svc.Library.GetSkill(ctx, "csv-totals")
	if err != nil || got.Content != d.Content || got.Description != "Total a CSV column." {
		t.Errorf("GetSkill: %+v, %v", got, err)
	}
	_, err = svc.Library.GetSkill(ctx, "none")
	wantClass(t, "GetSkill of an unknown name", err, errdefs.ErrNotFound)
}
