//go:build integration

package e2e_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// skillDirs lists shared/skills/, hidden entries included.
func skillDirs(t *testing.T, data string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(data, "shared", "skills"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// TestSkills creates a skill from text, lists and reads it, and runs a task
// whose prompt lists it and whose worker reads it from the shared workspace.
func TestSkills(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	ctx := context.Background()
	sk, err := s.client.CreateSkill(ctx, service.CreateSkillRequest{
		Name: "csv-totals", Description: "Total a CSV column by category.\nLonger explanation.",
		Dependencies: []string{"awk"}, Instructions: "# CSV totals\n\nRun `awk -F, '{t[$1]+=$2}'`.\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	if sk.Name != "csv-totals" || !strings.HasPrefix(sk.Content, "---\nname: csv-totals\n") || !strings.Contains(sk.Content, "# CSV totals") {
		t.Errorf("created %+v", sk)
	}
	list, err := s.client.ListSkills(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "csv-totals" || list[0].Error != "" || !slices.Equal(list[0].Dependencies, []string{"awk"}) {
		t.Errorf("list: %+v, %v", list, err)
	}
	got, err := s.client.GetSkill(ctx, "csv-totals")
	if err != nil || got.Content != sk.Content || len(got.Files) != 1 || got.Files[0].Path != "SKILL.md" {
		t.Errorf("get: %+v, %v", got, err)
	}
	if types := s.eventTypes(t, task.SkillStreamID("csv-totals")); !slices.Equal(types, []string{task.EventSkillCreated}) {
		t.Errorf("skill stream: %v", types)
	}

	tk := s.spawn(t, "use the csv-totals skill", "sh", "-c",
		`grep -F '/workspace/shared/skills/csv-totals/SKILL.md`+"`"+`: Total a CSV column by category.' /task/prompt.md > output/listed.txt
cat /workspace/shared/skills/csv-totals/SKILL.md > output/skill.md`)
	res := s.wait(t, tk.ID, 60*time.Second, "listed.txt", "skill.md")
	if res.Status != task.Success {
		t.Fatalf("status %s: %s (is the skill in the prompt?)", res.Status, res.ErrorMessage)
	}
	if res.FileContents["skill.md"].Content != sk.Content {
		t.Errorf("the worker read %q, want %q", res.FileContents["skill.md"].Content, sk.Content)
	}
	if strings.Contains(res.FileContents["listed.txt"].Content, "Longer explanation") {
		t.Errorf("the prompt lists more than the first line: %q", res.FileContents["listed.txt"].Content)
	}

	// The CLI.
	if out := s.runCLI(t, "skills", "--server", s.url); !strings.Contains(out, "csv-totals") || !strings.Contains(out, "Total a CSV column by category.") {
		t.Errorf("corral skills: %q", out)
	}
	if out := s.runCLI(t, "skills", "show", "csv-totals", "--server", s.url); out != sk.Content {
		t.Errorf("corral skills show: %q", out)
	}
	def := filepath.Join(t.TempDir(), "SKILL.md")
	os.WriteFile(def, []byte("---\nname: from-cli\ndescription: made with the CLI\n---\nbody\n"), 0o644)
	if out := s.runCLI(t, "skills", "create", "--file", def, "--server", s.url); !strings.Contains(out, "created skill from-cli") {
		t.Errorf("corral skills create: %q", out)
	}
}

// TestSkillFromTask makes a skill of a finished task's output files and
// runs its script in a second task.
func TestSkillFromTask(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	ctx := context.Background()
	maker := s.spawn(t, "write a skill", "sh", "-c", `printf -- '---\nname: greeter\ndescription: Says hello.\n---\nRun greet.sh NAME.\n' > output/SKILL.md
printf '#!/bin/sh\necho "hello, $1"\n' > output/greet.sh
echo scratch > output/notes.txt`)
	s.waitSuccess(t, maker.ID, 60*time.Second)
	sk, err := s.client.CreateSkill(ctx, service.CreateSkillRequest{TaskID: maker.ID, Files: []string{"greet.sh"}})
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, f := range sk.Files {
		files = append(files, f.Path)
	}
	if sk.Name != "greeter" || !slices.Equal(files, []string{"SKILL.md", "greet.sh"}) {
		t.Errorf("skill %s with files %v, want greeter with SKILL.md and greet.sh", sk.Name, files)
	}
	user := s.spawn(t, "greet", "sh", "-c", `sh /workspace/shared/skills/greeter/greet.sh corral > output/out.txt`)
	res := s.wait(t, user.ID, 60*time.Second, "out.txt")
	if res.Status != task.Success || res.FileContents["out.txt"].Content != "hello, corral\n" {
		t.Errorf("user: %s %q %s", res.Status, res.FileContents["out.txt"].Content, res.ErrorMessage)
	}

	// A task that did not succeed cannot make a skill.
	failed := s.spawn(t, "fail", "sh", "-c", `printf -- '---\nname: broken\ndescription: x\n---\n' > output/SKILL.md; exit 3`)
	s.wait(t, failed.ID, 60*time.Second)
	_, err = s.client.CreateSkill(ctx, service.CreateSkillRequest{TaskID: failed.ID})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "succeeded") {
		t.Errorf("skill from a failed task: %v", err)
	}
}

// TestSkillsBadInput: invalid names and frontmatter and duplicate names are
// clear 4xx answers, and nothing is written.
func TestSkillsBadInput(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	if code, body := s.do(t, "POST", "/api/skills", "application/json", strings.NewReader(`{"name":"dup","description":"first"}`)); code != 201 {
		t.Fatalf("create dup: %d %s", code, body)
	}
	done := s.spawn(t, "no skill here", "sh", "-c", "echo x > output/x.txt")
	s.wait(t, done.ID, 60*time.Second)
	before := s.snapshot(t)
	long := strings.Repeat("a", 65)
	cases := []struct {
		name, method, path, body string
		status                   int
		mention                  string
	}{
		{"duplicate", "POST", "/api/skills", `{"name":"dup","description":"again"}`, 409, "exists"},
		{"duplicate in content", "POST", "/api/skills", `{"content":"---\nname: dup\ndescription: again\n---\n"}`, 409, "exists"},
		{"upper case", "POST", "/api/skills", `{"name":"Bad_Name","description":"x"}`, 400, "name"},
		{"too long", "POST", "/api/skills", `{"name":"` + long + `","description":"x"}`, 400, "name"},
		{"path name", "POST", "/api/skills", `{"name":"../etc","description":"x"}`, 400, "name"},
		{"no description", "POST", "/api/skills", `{"name":"ok-name"}`, 400, "description"},
		{"description too long", "POST", "/api/skills", `{"name":"ok-name","description":"` + strings.Repeat("d", 1025) + `"}`, 400, "description"},
		{"no frontmatter", "POST", "/api/skills", `{"content":"# just text\n"}`, 400, "frontmatter"},
		{"bad yaml", "POST", "/api/skills", `{"content":"---\nname: [x\n---\n"}`, 400, "frontmatter"},
		{"unclosed", "POST", "/api/skills", `{"content":"---\nname: x\ndescription: y\n"}`, 400, "frontmatter"},
		{"wrong type", "POST", "/api/skills", `{"content":"---\nname: x\ndescription: y\ndependencies: {a: 1}\n---\n"}`, 400, "dependencies"},
		{"content and fields", "POST", "/api/skills", `{"content":"---\nname: x\ndescription: y\n---\n","name":"x"}`, 400, "content"},
		{"nothing", "POST", "/api/skills", `{}`, 400, "content"},
		{"files without task", "POST", "/api/skills", `{"name":"x","description":"y","files":["a"]}`, 400, "files"},
		{"unknown task", "POST", "/api/skills", `{"name":"x","description":"y","task_id":"task-00000000000000000000000000"}`, 422, "task_id"},
		{"task without SKILL.md", "POST", "/api/skills", `{"task_id":"` + done.ID + `"}`, 400, "content"},
		{"file not in output", "POST", "/api/skills", `{"name":"x","description":"y","task_id":"` + done.ID + `","files":["../prompt.md"]}`, 403, "files[0]"},
		{"file unknown", "POST", "/api/skills", `{"name":"x","description":"y","task_id":"` + done.ID + `","files":["nope.sh"]}`, 422, "files[0]"},
		{"get invalid", "GET", "/api/skills/Bad_Name", "", 400, "name"},
		{"get unknown", "GET", "/api/skills/nope", "", 404, "nope"},
	}
	for _, c := range cases {
		var code int
		var resp string
		if c.body != "" {
			code, resp = s.do(t, c.method, c.path, "application/json", strings.NewReader(c.body))
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
	if got := skillDirs(t, s.data); !slices.Equal(got, []string{"dup"}) {
		t.Errorf("shared/skills/ = %v, want only dup", got)
	}
	if b, _ := os.ReadFile(filepath.Join(s.data, "shared", "skills", "dup", "SKILL.md")); !strings.Contains(string(b), "first") {
		t.Errorf("dup's SKILL.md changed: %q", b)
	}
}
