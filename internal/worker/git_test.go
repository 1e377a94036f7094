package worker

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/workerproto"
)

// TestGitKeepsTheSecrets: git runs what the repository's configuration
// names (here core.fsmonitor), and the repository is the agent's; what it
// runs gets no secret of the task.
func TestGitKeepsTheSecrets(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git not installed")
	}
	t.Setenv(workerproto.EnvWebhookKey, "0123456789abcdef0123456789abcdef")
	t.Setenv(workerproto.EnvSessionToken, "session-token-value")
	dir := t.TempDir()
	dump := filepath.Join(dir, "env.txt")
	hook := filepath.Join(dir, "hook.sh")
	if err := os.WriteFile(hook, []byte("#!/bin/sh\nenv > "+dump+"\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	repo := filepath.Join(dir, "repo")
	for _, args := range [][]string{{"init", "-q", repo}, {"-C", repo, "config", "core.fsmonitor", hook}} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v %s", args, err, out)
		}
	}
	if _, err := git(repo, "status", "--porcelain"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(dump)
	if err != nil {
		t.Fatalf("the repository's fsmonitor hook did not run, so this test shows nothing: %v", err)
	}
	for _, name := range []string{workerproto.EnvWebhookKey, workerproto.EnvSessionToken} {
		if strings.Contains(string(b), name+"=") {
			t.Errorf("what git ran for the repository got %s", name)
		}
	}
}
