//go:build integration

package e2e_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/agent/agenttest"
	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/session"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestWorkspaces: named workspaces are created (with git when asked),
// listed and browsed read-only; every path that is not a workspace name
// is refused with the rule it breaks, and nothing is created.
func TestWorkspaces(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	ctx := context.Background()
	p, err := s.client.CreateProject(ctx, service.CreateProjectRequest{Name: "myapp", InitGit: true})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Git || p.Name != "myapp" || p.Path != "/workspace/project" {
		t.Errorf("created %+v, want myapp with git", p)
	}
	if _, err := s.client.CreateProject(ctx, service.CreateProjectRequest{Name: "myapp"}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("creating myapp again: %v, want 409", err)
	}
	dir := filepath.Join(s.data, "projects", "myapp")
	if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte("# my app\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ps, err := s.client.ListProjects(ctx)
	if err != nil || len(ps) != 1 || ps[0].Name != "myapp" {
		t.Errorf("ListProjects = %+v, %v", ps, err)
	}
	ents, err := s.client.ListProjectFiles(ctx, "myapp", ".", false)
	var names []string
	for _, e := range ents {
		names = append(names, e.Path)
	}
	if err != nil || !strings.Contains(strings.Join(names, " "), "README.md") {
		t.Errorf("files of myapp: %v, %v", names, err)
	}
	if f, err := s.client.ReadProjectFile(ctx, "myapp", "README.md"); err != nil || f.Content != "# my app\n" {
		t.Errorf("README.md: %+v, %v", f, err)
	}
	if got := s.runCLI(t, "run", "--server", s.url, "--follow", "--workspace", "myapp", "list the workspace", "--", "sh", "-c", "ls > listing.txt"); !strings.Contains(got, "success") {
		t.Errorf("corral run --workspace: %q", got)
	}
	if f, err := s.client.ReadProjectFile(ctx, "myapp", "listing.txt"); err != nil || !strings.Contains(f.Content, "README.md") {
		t.Errorf("the CLI's workspace task: %q, %v", f.Content, err)
	}
	if got := s.runCLI(t, "workspaces", "cat", "--server", s.url, "myapp", "README.md"); got != "# my app\n" {
		t.Errorf("corral workspaces cat: %q", got)
	}

	// A session can work in a named workspace, as its one writer: a task
	// there waits for the session's end, and a second session is refused.
	sess, err := s.client.CreateSession(ctx, session.CreateRequest{Workspace: "myapp"})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if _, err := s.client.ExecSession(ctx, sess.SessionID, httpapi.ExecBody{Command: shell("cat README.md; echo from-session > s.txt")}, func(ch httpapi.ExecChunk) error { out.Write(ch.Bytes()); return nil }); err != nil || out.String() != "# my app\n" {
		t.Errorf("a session in workspace myapp: %q, %v", out.String(), err)
	}
	if _, err := s.client.CreateSession(ctx, session.CreateRequest{Workspace: "myapp"}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a second session on myapp: %v, want 409", err)
	}
	waiting := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "after the session", Workspace: "myapp", Agent: "command", Command: []string{"sh", "-c", "cat s.txt > after.txt"}})
	time.Sleep(time.Second)
	if tk, _ := s.client.Get(ctx, waiting.ID); tk.Status != task.Queued {
		t.Errorf("a task on a workspace a session writes: %s, want queued", tk.Status)
	}
	if _, err := s.client.DeleteSession(ctx, sess.SessionID); err != nil {
		t.Fatal(err)
	}
	s.waitSuccess(t, waiting.ID, 60*time.Second)
	if f, err := s.client.ReadProjectFile(ctx, "myapp", "after.txt"); err != nil || f.Content != "from-session\n" {
		t.Errorf("the task after the session: %q, %v", f.Content, err)
	}
	// And the other way round: no session while a task writes it.
	busy := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "busy", Workspace: "myapp", Agent: "command", Command: []string{"sleep", "60"}})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if tk, _ := s.client.Get(ctx, busy.ID); tk.Status == task.Running || time.Now().After(deadline) {
			break
		}
	}
	if _, err := s.client.CreateSession(ctx, session.CreateRequest{Workspace: "myapp"}); !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), busy.ID) {
		t.Errorf("a session on a workspace a task writes: %v, want 409 naming the task", err)
	}
	s.client.Cancel(ctx, busy.ID)
	s.wait(t, busy.ID, 60*time.Second)

	// A link out of projects/ is no workspace, and a link inside one leads
	// nowhere outside it.
	if err := os.Symlink("/etc", filepath.Join(s.data, "projects", "evil")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc/passwd", filepath.Join(dir, "passwd")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.ListProjectFiles(ctx, "evil", ".", false); !errors.Is(err, errdefs.ErrPermissionDenied) || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("a symlink out as a workspace: %v, want 403 naming the link", err)
	}
	if f, err := s.client.ReadProjectFile(ctx, "myapp", "passwd"); err == nil || strings.Contains(f.Content, "root:") {
		t.Errorf("a symlink out inside a workspace: %+v, %v; want refused", f, err)
	}

	for _, tc := range []struct {
		name string
		want error
		rule string
	}{
		{"/", errdefs.ErrPermissionDenied, "system directory"},
		{"/usr", errdefs.ErrPermissionDenied, "system directory"},
		{"/etc", errdefs.ErrPermissionDenied, "system directory"},
		{"/srv/repos/app", errdefs.ErrPermissionDenied, "outside the data root"},
		{"../x", errdefs.ErrInvalidArgument, "goes up with .."},
		{"a/b", errdefs.ErrInvalidArgument, "no .. or /"},
		{"Bad", errdefs.ErrInvalidArgument, "lowercase"},
		{"a\x00b", errdefs.ErrInvalidArgument, "NUL"},
		{strings.Repeat("a", 65), errdefs.ErrInvalidArgument, "at most 64"},
		{strings.Repeat("a", 5000), errdefs.ErrInvalidArgument, "at most 4096"},
	} {
		_, err := s.client.CreateProject(ctx, service.CreateProjectRequest{Name: tc.name})
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.rule) {
			t.Errorf("create %.20q: %v, want %v naming %q", tc.name, err, tc.want, tc.rule)
		}
	}
	ents2, _ := os.ReadDir(filepath.Join(s.data, "projects"))
	if len(ents2) != 2 { // myapp and the evil link
		t.Errorf("projects/ holds %d entries after the refusals, want 2", len(ents2))
	}
}

// TestWorkspaceRoots: a directory directly under an operator's root
// (workspaces.roots) is a workspace named by its path: a person's
// repository there is worked in and stays the person's, one can be created
// there with git, and everything else under or beside a root is refused
// with the rule it breaks, nothing created.
func TestWorkspaceRoots(t *testing.T) {
	t.Parallel()
	testenv.RequireRoot(t)
	const person = 1000
	roots := testenv.TempDir(t)
	if err := os.Chmod(roots, 0o755); err != nil {
		t.Fatal(err)
	}
	repos := filepath.Join(roots, "repos")
	app := filepath.Join(repos, "App")
	for _, d := range []string{repos, app, filepath.Join(app, "deeper")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(app, "main.go"), []byte("package main\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{repos, app, filepath.Join(app, "deeper"), filepath.Join(app, "main.go")} {
		if err := os.Chown(p, person, person); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc", filepath.Join(repos, "etc-link")); err != nil {
		t.Fatal(err)
	}
	s := MustStart(t, func(c *config.Config) { c.Workspaces.Roots = []string{repos} })
	ctx := context.Background()

	id := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "edit the app", Workspace: app, Agent: "command",
		Command: []string{"sh", "-c", "pwd > where.txt; echo '// edited' >> main.go"}})
	s.waitSuccess(t, id.ID, 60*time.Second)
	if tk, _ := s.client.Get(ctx, id.ID); tk.Workspace != app {
		t.Errorf("the task's workspace = %q, want %q", tk.Workspace, app)
	}
	if f, err := s.client.ReadProjectFile(ctx, app, "where.txt"); err != nil || f.Content != "/workspace/project\n" {
		t.Errorf("where.txt through the API: %q, %v", f.Content, err)
	}
	if b, _ := os.ReadFile(filepath.Join(app, "main.go")); string(b) != "package main\n// edited\n" {
		t.Errorf("main.go = %q", b)
	}
	// All of it is the person's again once the sandbox is gone (a moment
	// after the result), what the task wrote too.
	notPersons := func() (bad []string) {
		filepath.WalkDir(app, func(p string, d os.DirEntry, err error) error {
			if fi, err := os.Lstat(p); err == nil {
				if st := fi.Sys().(*syscall.Stat_t); st.Uid != person || st.Gid != person {
					bad = append(bad, fmt.Sprintf("%s (%d:%d)", p, st.Uid, st.Gid))
				}
			}
			return nil
		})
		return bad
	}
	for deadline := time.Now().Add(10 * time.Second); len(notPersons()) > 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if bad := notPersons(); len(bad) > 0 {
		t.Errorf("not the person's (%d:%d) after the task: %v", person, person, bad)
	}

	fresh := filepath.Join(repos, "fresh")
	p, err := s.client.CreateProject(ctx, service.CreateProjectRequest{Name: fresh, InitGit: true})
	if err != nil || p.Name != fresh || !p.Git {
		t.Fatalf("create %s: %+v, %v", fresh, p, err)
	}
	if fi, err := os.Stat(filepath.Join(fresh, ".git", "HEAD")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != person {
		t.Errorf("the new repository is not the root's owner's: %v", err)
	}
	ps, err := s.client.ListProjects(ctx)
	var names []string
	for _, p := range ps {
		names = append(names, p.Name)
	}
	if err != nil || !slices.Contains(names, app) || !slices.Contains(names, fresh) || slices.Contains(names, filepath.Join(repos, "etc-link")) {
		t.Errorf("ListProjects = %v, %v; want %s and %s, not the link", names, err, app, fresh)
	}

	before, _ := os.ReadDir(repos)
	for _, tc := range []struct {
		name string
		want error
		rule string
	}{
		{repos, errdefs.ErrPermissionDenied, "under none of the workspace roots"},
		{filepath.Join(app, "deeper"), errdefs.ErrInvalidArgument, "directly under the workspace root"},
		{filepath.Join(repos, "etc-link"), errdefs.ErrPermissionDenied, "symbolic link"},
		{repos + "/../../etc", errdefs.ErrInvalidArgument, "goes up with .."},
		{filepath.Join(roots, "elsewhere"), errdefs.ErrPermissionDenied, "under none of the workspace roots"},
		{"/etc/app", errdefs.ErrPermissionDenied, "system directory"},
		{"/", errdefs.ErrPermissionDenied, "system directory"},
	} {
		_, err := s.client.CreateProject(ctx, service.CreateProjectRequest{Name: tc.name})
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.rule) {
			t.Errorf("create %q: %v, want %v naming %q", tc.name, err, tc.want, tc.rule)
		}
		if _, _, err := s.client.Spawn(ctx, service.SpawnRequest{TaskDescription: "x", Workspace: tc.name, Agent: "command", Command: []string{"true"}}); !errors.Is(err, tc.want) {
			t.Errorf("spawn in %q: %v, want %v", tc.name, err, tc.want)
		}
	}
	if after, _ := os.ReadDir(repos); len(after) != len(before) {
		t.Errorf("%s holds %d entries after the refusals, %d before", repos, len(after), len(before))
	}
	if _, err := os.Stat(filepath.Join(roots, "elsewhere")); err == nil {
		t.Errorf("a workspace was created outside the roots")
	}
}

// TestWorkspaceTasks: spawn_workspace_task creates the workspace (with
// git), the agent works in it, and tasks on one workspace run one after
// another while a task on another workspace runs beside them.
func TestWorkspaceTasks(t *testing.T) {
	t.Parallel()
	s := MustStart(t, func(c *config.Config) { c.AIWorker.MaxConcurrentWorkers = 3 })
	ctx := context.Background()
	var first struct {
		TaskID           string `json:"task_id"`
		Workspace        string `json:"workspace"`
		WorkspaceCreated bool   `json:"workspace_created"`
	}
	s.callTool(t, "spawn_workspace_task", map[string]any{
		"workspace_path": "/workspace/projects/app", "task_description": "Start the app", "query": "Write hello.txt",
		"init_git": true, "agent": "command", "command": []string{"sh", "-c", "pwd > where.txt; echo hello > hello.txt; sleep 1"},
	}, &first)
	if first.Workspace != "app" || !first.WorkspaceCreated {
		t.Fatalf("spawn_workspace_task = %+v, want workspace app created", first)
	}
	spawn := func(ws, script string) string {
		tk := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "work in " + ws, Workspace: ws, Agent: "command", Command: []string{"sh", "-c", script}})
		return tk.ID
	}
	second := spawn("app", "cat hello.txt > seen.txt; sleep 1")
	if _, err := s.client.CreateProject(ctx, service.CreateProjectRequest{Name: "other"}); err != nil {
		t.Fatal(err)
	}
	other := spawn("other", "sleep 1")
	for _, id := range []string{first.TaskID, second, other} {
		s.waitSuccess(t, id, 60*time.Second)
	}
	if f, err := s.client.ReadProjectFile(ctx, "app", "where.txt"); err != nil || f.Content != "/workspace/project\n" {
		t.Errorf("the agent's working directory: %q, %v", f.Content, err)
	}
	if f, err := s.client.ReadProjectFile(ctx, "app", "seen.txt"); err != nil || f.Content != "hello\n" {
		t.Errorf("the second task did not see the first one's file: %q, %v", f.Content, err)
	}
	if _, err := os.Stat(filepath.Join(s.data, "projects", "app", ".git")); err != nil {
		t.Errorf("the workspace has no git repository: %v", err)
	}
	span := func(id string) (start, end time.Time) {
		for _, e := range taskEvents(t, s, id, "") {
			switch e.Type {
			case task.EventStarting:
				start = e.RecordedAt
			case task.EventCompleted:
				end = e.RecordedAt
			}
		}
		return start, end
	}
	s1, e1 := span(first.TaskID)
	s2, _ := span(second)
	so, eo := span(other)
	if s2.Before(e1) {
		t.Errorf("two tasks on workspace app overlapped: the first ran %s–%s, the second started %s", s1.Format(time.StampMilli), e1.Format(time.StampMilli), s2.Format(time.StampMilli))
	}
	if !so.Before(e1) || !s1.Before(eo) {
		t.Errorf("the task on another workspace waited: app ran %s–%s, other %s–%s", s1.Format(time.StampMilli), e1.Format(time.StampMilli), so.Format(time.StampMilli), eo.Format(time.StampMilli))
	}
	// What each task changed in the git workspace comes with its result.
	res, _ := s.client.Result(ctx, service.ResultRequest{TaskID: first.TaskID})
	if c := res.Changes; c == nil || !slices.Contains(c.Added, "hello.txt") || !slices.Contains(c.Added, "where.txt") {
		t.Errorf("the first task's changes: %+v, want hello.txt and where.txt added", res.Changes)
	}
	third := spawn("app", "git add -A && git -c user.name=T -c user.email=t@example.com commit -qm 'Add the first files'")
	if res := s.wait(t, third, 60*time.Second); res.Status != task.Success || res.Changes == nil ||
		len(res.Changes.Commits) != 1 || res.Changes.Commits[0].Subject != "Add the first files" || !slices.Contains(res.Changes.Added, "seen.txt") {
		t.Errorf("a committing task: %s %s, changes %+v; want its commit and the files it added", res.Status, res.ErrorMessage, res.Changes)
	}
	fourth := spawn("app", "echo bye > hello.txt; rm where.txt")
	if res := s.wait(t, fourth, 60*time.Second); res.Changes == nil ||
		!slices.Equal(res.Changes.Modified, []string{"hello.txt"}) || !slices.Equal(res.Changes.Deleted, []string{"where.txt"}) || len(res.Changes.Commits) != 0 {
		t.Errorf("an editing task's changes: %+v, want hello.txt modified and where.txt deleted", res.Changes)
	}
	if res, _ := s.client.Result(ctx, service.ResultRequest{TaskID: other}); res.Changes != nil {
		t.Errorf("a task in a workspace without git reports changes: %+v", res.Changes)
	}

	if page, err := s.client.List(ctx, service.ListRequest{Workspace: "app"}); err != nil || len(page.Tasks) != 4 {
		t.Errorf("tasks in workspace app: %d, %v; want 4", len(page.Tasks), err)
	}

	// A task naming a workspace that is not there is refused.
	if _, _, err := s.client.Spawn(ctx, service.SpawnRequest{TaskDescription: "x", Workspace: "nowhere", Agent: "command", Command: []string{"true"}}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("a task in a missing workspace: %v, want 422", err)
	}
}

// TestClaudeWorkspaceTasks: the real Claude Code CLI edits a file in a new
// workspace, and the next task there continues its conversation.
func TestClaudeWorkspaceTasks(t *testing.T) {
	t.Parallel()
	s, ep := mustClaudeServer(t, agenttest.AnthropicOptions{Replies: []agenttest.Reply{
		{Text: "Writing the notes.", Tool: &agenttest.ToolCall{Name: "Write", Input: map[string]any{"file_path": "/workspace/project/NOTES.md", "content": "# Notes\nfirst pass\n"}}},
		{Text: "Wrote NOTES.md."},
		{Text: "I remember: NOTES.md holds the first pass."},
	}})
	ctx := context.Background()
	if _, err := s.client.CreateProject(ctx, service.CreateProjectRequest{Name: "notes", InitGit: true}); err != nil {
		t.Fatal(err)
	}
	first := spawnClaude(t, s, service.SpawnRequest{TaskDescription: "Write NOTES.md", Workspace: "notes"})
	s.waitSuccess(t, first.ID, 3*time.Minute)
	if f, err := s.client.ReadProjectFile(ctx, "notes", "NOTES.md"); err != nil || f.Content != "# Notes\nfirst pass\n" {
		t.Fatalf("NOTES.md in the workspace: %q, %v", f.Content, err)
	}
	before := len(ep.Requests())
	second := spawnClaude(t, s, service.SpawnRequest{TaskDescription: "What did you write last time?", Workspace: "notes"})
	s.waitSuccess(t, second.ID, 3*time.Minute)
	var firstMain *agenttest.AnthropicRequest
	for _, r := range ep.Requests()[before:] {
		if r.Main {
			firstMain = &r
			break
		}
	}
	if firstMain != nil {
		t.Logf("the second task's first request: %d messages", firstMain.Messages)
	}
	// The first task's conversation had a user turn, a tool call, its
	// result and an answer; continued, the second's first request holds
	// them before its own question.
	if firstMain == nil || firstMain.Messages < 4 {
		t.Errorf("the second task's first model request holds %v messages, want the first task's conversation continued", firstMain)
	}
}
