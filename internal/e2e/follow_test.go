//go:build integration

package e2e_test

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/testenv"
)

// TestFollowSurvivesRestart: corral run --follow and corral logs -f, run
// as a person runs them, outlive a kill -9 of the server and a graceful
// restart (SIGTERM), each followed by a new server: they say they lost it,
// reconnect, and end with the task's result and its whole transcript,
// printed once.
func TestFollowSurvivesRestart(t *testing.T) {
	testenv.RequireBwrap(t)
	t.Parallel()
	data := testenv.TempDir(t)
	addr := freeLoopbackAddr(t)
	srv := startProcessAt(t, data, addr, "")

	run := startCLI(t, "run", "--follow", "--server", srv.url, "crosses a restart",
		"--", "sh", "-c", "echo one; sleep 5; echo two; sleep 5; echo three; echo survived > output/result.txt")
	id := waitMatch(t, &run.stderr, regexp.MustCompile(`task (task-[a-z0-9]+) queued`))
	logs := startCLI(t, "logs", "-f", "--server", srv.url, id)
	waitMatch(t, &logs.stdout, regexp.MustCompile(`one\n`))

	srv.kill() // the streams are cut
	time.Sleep(time.Second)
	srv = startProcessAt(t, data, addr, "")
	waitMatch(t, &logs.stdout, regexp.MustCompile(`two\n`))

	// The server ends the streams itself and exits.
	if err := srv.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	srv.cmd.Wait()
	startProcessAt(t, data, addr, "")

	for _, c := range []*cli{run, logs} {
		if err := c.wait(60 * time.Second); err != nil {
			t.Errorf("corral %s: %v\nstdout:\n%s\nstderr:\n%s", c.args[0], err, c.stdout.String(), c.stderr.String())
		}
		if !strings.Contains(c.stderr.String(), "corral: lost the server") {
			t.Errorf("corral %s did not say it lost the server:\n%s", c.args[0], c.stderr.String())
		}
	}
	if out := run.stdout.String(); !strings.Contains(out, "status:   success") {
		t.Errorf("corral run --follow printed:\n%s\nwant the task's success", out)
	}
	if out := logs.stdout.String(); out != "one\ntwo\nthree\n" {
		t.Errorf("corral logs -f printed %q, want \"one\\ntwo\\nthree\\n\"", out)
	}
}

// withoutCorralEnv is the test's environment without CORRAL_* and
// AI_WORKER_* variables, which would configure the server or the CLI.
func withoutCorralEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CORRAL_") && !strings.HasPrefix(kv, "AI_WORKER_") {
			env = append(env, kv)
		}
	}
	return env
}

// cli is a corral CLI command running in the background.
type cli struct {
	args           []string
	stdout, stderr testenv.SyncBuffer
	done           chan error
}

func startCLI(t *testing.T, args ...string) *cli {
	t.Helper()
	c := &cli{args: args, done: make(chan error, 1)}
	cmd := exec.Command(corralBin, args...)
	cmd.Env = withoutCorralEnv()
	cmd.Stdout, cmd.Stderr = &c.stdout, &c.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-c.done
	})
	return c
}

// wait waits for the command to end, and returns its exit error.
func (c *cli) wait(within time.Duration) error {
	select {
	case err := <-c.done:
		c.done <- err // for the cleanup
		return err
	case <-time.After(within):
		return fmt.Errorf("did not end within %s", within)
	}
}

// waitMatch waits for re to match what b holds, and returns its first
// group.
func waitMatch(t *testing.T, b *testenv.SyncBuffer, re *regexp.Regexp) string {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m := re.FindStringSubmatch(b.String()); m != nil {
			return m[len(m)-1]
		}
	}
	t.Fatalf("no %s in %q", re, b.String())
	return ""
}
