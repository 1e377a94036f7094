//go:build integration

package e2e_test

import (
	"context"
	"errors"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/session"
)

// TestCLIExitCodes: the binary, against a real server, exits with the
// code a script relies on: run --follow with the task's own exit code
// (130 for a task cancelled while followed), exec with the command's, the
// session named by a prefix of its id; tasks -q lists the ids alone.
func TestCLIExitCodes(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	code := func(args ...string) (int, string, string) {
		t.Helper()
		stdout, stderr, err := s.cli(t, nil, args...)
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), stdout, stderr
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0, stdout, stderr
	}
	for _, c := range []struct {
		script string
		want   int
	}{{"exit 0", 0}, {"exit 3", 3}} {
		got, stdout, stderr := code("run", "--follow", "--server", s.url, "exits", "--", "sh", "-c", c.script)
		if got != c.want || !strings.Contains(stdout, "status:") {
			t.Errorf("run --follow -- sh -c %q: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", c.script, got, c.want, stdout, stderr)
		}
	}
	if got, stdout, _ := code("tasks", "-q", "--server", s.url); got != 0 || !regexp.MustCompile(`^(task-[0-9a-z]+\n){2}$`).MatchString(stdout) {
		t.Errorf("tasks -q: exit %d, %q; want the 2 tasks' ids", got, stdout)
	}

	// A task cancelled while followed: 130.
	run := startCLI(t, "run", "--follow", "--server", s.url, "waits", "--", "sleep", "600")
	id := waitMatch(t, &run.stderr, regexp.MustCompile(`task (task-[a-z0-9]+) queued`))
	waitMatch(t, &run.stderr, regexp.MustCompile(`running\n`))
	if got, _, stderr := code("cancel", "--server", s.url, strings.TrimPrefix(id, "task-")[:12]); got != 0 {
		t.Fatalf("cancel by a prefix of the id: exit %d: %s", got, stderr)
	}
	err := run.wait(60 * time.Second)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Errorf("run --follow of a task cancelled: %v, want exit 130\nstderr:\n%s", err, run.stderr.String())
	}

	// exec exits with the command's code; the session is named by a
	// prefix of its id.
	created, err := s.client.CreateSession(context.Background(), session.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.client.DeleteSession(context.Background(), created.SessionID)
	if got, stdout, stderr := code("exec", "--server", s.url, created.SessionID[:len("sess-")+12], "--", "sh", "-c", "echo in-session; exit 5"); got != 5 || stdout != "in-session\n" {
		t.Errorf("exec: exit %d, stdout %q, stderr %q; want 5 and in-session", got, stdout, stderr)
	}
}
