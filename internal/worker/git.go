package worker

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workerproto"
)

// git runs git in dir with a fixed environment and returns its stdout.
// The environment is the worker's without the task's secrets: the
// repository is the agent's to configure, and git runs what its
// configuration names (core.fsmonitor, diff drivers).
func git(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("git", append([]string{"-C", dir, "-c", "core.quotepath=false"}, args...)...)
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		k, _, _ := strings.Cut(kv, "=")
		return k == workerproto.EnvWebhookKey || k == workerproto.EnvSessionToken
	})
	cmd.Env = append(env, "GIT_TERMINAL_PROMPT=0", "GIT_OPTIONAL_LOCKS=0")
	return cmd.Output()
}

// gitHead is dir's HEAD commit if dir is the top of a git work tree with
// git installed, else "".
func gitHead(dir string) string {
	if dir == "" {
		return ""
	}
	if fi, err := os.Stat(filepath.Join(dir, ".git")); err != nil || !fi.IsDir() {
		return ""
	}
	out, err := git(dir, "rev-parse", "--verify", "-q", "HEAD")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// gitChanges is what changed in dir since commit start: the files added,
// modified and deleted (committed or not, untracked files counting as
// added) and the commits made since.
func gitChanges(dir, start string) *task.Changes {
	c := &task.Changes{Added: []string{}, Modified: []string{}, Deleted: []string{}, Commits: []task.Commit{}}
	add := func(list *[]string, name string) {
		if len(*list) >= task.MaxChangedFiles {
			c.Truncated = true
			return
		}
		*list = append(*list, name)
	}
	if out, err := git(dir, "diff", "--name-status", "--no-renames", "-z", start, "--"); err == nil {
		f := bytes.Split(bytes.TrimRight(out, "\x00"), []byte{0})
		for i := 0; i+1 < len(f); i += 2 {
			switch string(f[i]) {
			case "A":
				add(&c.Added, string(f[i+1]))
			case "D":
				add(&c.Deleted, string(f[i+1]))
			default:
				add(&c.Modified, string(f[i+1]))
			}
		}
	}
	if out, err := git(dir, "ls-files", "--others", "--exclude-standard", "-z"); err == nil {
		for _, name := range bytes.Split(bytes.TrimRight(out, "\x00"), []byte{0}) {
			if len(name) > 0 {
				add(&c.Added, string(name))
			}
		}
	}
	if out, err := git(dir, "log", "--format=%H%x00%s%x00", "-n", strconv.Itoa(task.MaxCommits+1), start+"..HEAD"); err == nil {
		f := bytes.Split(bytes.TrimRight(out, "\x00\n"), []byte{0})
		for i := 0; i+1 < len(f); i += 2 {
			if len(c.Commits) >= task.MaxCommits {
				c.Truncated = true
				break
			}
			c.Commits = append(c.Commits, task.Commit{Hash: strings.TrimSpace(string(f[i])), Subject: string(f[i+1])})
		}
	}
	return c
}
