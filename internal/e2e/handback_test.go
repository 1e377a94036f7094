//go:build integration

package e2e_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// workspaceOwner is the person owning the workspace root in these tests.
const workspaceOwner = 1000

// workspaceRoot makes an operator's workspace root (repos/, the person's)
// with the person's workspace app/ in it, and a host directory the person
// must never reach through a task: root's files, 0640 and 0755.
func workspaceRoot(t *testing.T) (repos, app, secrets string) {
	t.Helper()
	top := testenv.TempDir(t)
	if err := os.Chmod(top, 0o755); err != nil {
		t.Fatal(err)
	}
	repos, app, secrets = filepath.Join(top, "repos"), filepath.Join(top, "repos", "app"), filepath.Join(top, "secrets")
	for _, d := range []string{repos, app, secrets} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{repos, app} {
		if err := os.Chown(p, workspaceOwner, workspaceOwner); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(secrets, "shadow"), []byte("root:x:"), 0o640); err != nil {
		t.Fatal(err)
	}
	return repos, app, secrets
}

// checkSecrets fails if anything under secrets changed owner or mode.
func checkSecrets(t *testing.T, secrets string) {
	t.Helper()
	for p, mode := range map[string]os.FileMode{secrets: os.ModeDir | 0o755, filepath.Join(secrets, "shadow"): 0o640} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 || st.Gid != 0 || fi.Mode() != mode {
			t.Errorf("%s is %d:%d %v after the task: a hand-back reached outside the workspace", p, st.Uid, st.Gid, fi.Mode())
		}
	}
}

// startSwapper builds testdata/swapper and starts it as the workspace's
// owner, in dir, with args.
func startSwapper(t *testing.T, dir string, args ...string) *exec.Cmd {
	t.Helper()
	bin := filepath.Join(testenv.TempDir(t), "swapper")
	mustBuildStatic(t, "./testdata/swapper", bin)
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: workspaceOwner, Gid: workspaceOwner, Groups: []uint32{}}}
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// stopSwapper stops the owner's loop and returns how many exchanges it
// made; it fails the test if it made none or left one in place.
func stopSwapper(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	out := cmd.Stdout.(*strings.Builder).String()
	if !strings.HasPrefix(out, "swaps ") || strings.HasPrefix(out, "swaps 0\n") || strings.Contains(out, "not put back") {
		t.Fatalf("the owner's loop: %q", out)
	}
	return strings.TrimSpace(out)
}

// testHandBack: a task on a workspace under an operator's root leaves
// what an attacker would (a large directory to slow the hand-back,
// directories anyone may write, set-uid copies of id, a FIFO, a branch
// nested past PATH_MAX with more of the same at its bottom and after it)
// while the workspace's owner swaps every directory of it, and the
// workspace itself, for links to a host directory, in a loop through the
// task's end and the hand-back. Before, the hand-back walked by path and
// gave the top back first: the owner came to own the host's files, and
// the deep branch stopped the walk, leaving set-uid files of the sandbox
// identity. Now nothing outside changes and all of the workspace is the
// owner's again, with no set-id, sticky or group/other write bit and no
// FIFO.
func testHandBack(t *testing.T, rt escapeRuntime) {
	testenv.RequireRoot(t)
	repos, app, secrets := workspaceRoot(t)
	s := MustStart(t, func(c *config.Config) {
		rt.config(t)(c)
		c.Workspaces.Roots = []string{repos}
	})
	script := `set -e
mkdir -p a/b/c big z/y
i=0; while [ $i -lt 3000 ]; do : > big/f$i; i=$((i+1)); done
cp /bin/id a/b/c/suid; chmod 6755 a/b/c/suid
mkfifo fifo
perl -e '$n = "0" x 200; for (1..30) { mkdir $n or die "mkdir: $!"; chdir $n or die "chdir: $!" }
  open(F, ">suid") or die; close F; chmod 06755, "suid" or die; mkdir "open" or die; chmod 01777, "open" or die'
cp /bin/id z/y/suid; chmod 6755 z/y/suid
chmod 1777 . a a/b a/b/c big z z/y
: > /task/output/go; : > /task/output/ready
while [ -e /task/output/go ]; do sleep 0.05; done`
	tk := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "leave hostile files in a workspace", Agent: "command",
		Runtime: rt.runtime, Workspace: app, Command: []string{"sh", "-c", script}})
	out := filepath.Join(s.data, "tasks", tk.ID, "output")
	waitFor(t, "the worker making its files", func() bool {
		_, err := os.Stat(filepath.Join(out, "ready"))
		return err == nil
	})
	racer := startSwapper(t, repos, "-target", secrets, "app", "app/a", "app/a/b", "app/a/b/c", "app/big", "app/z", "app/z/y")
	time.Sleep(50 * time.Millisecond)
	os.Remove(filepath.Join(out, "go"))
	s.waitSuccess(t, tk.ID, 120*time.Second)
	// The top goes back last: once it is the owner's (under either name
	// the racer gives it), the hand-back is over.
	waitFor(t, "the workspace handed back", func() bool {
		for _, p := range []string{app, app + ".link"} {
			if fi, err := os.Lstat(p); err == nil && fi.IsDir() && fi.Sys().(*syscall.Stat_t).Uid == workspaceOwner {
				return true
			}
		}
		return false
	})
	time.Sleep(50 * time.Millisecond)
	swaps := stopSwapper(t, racer)
	checkSecrets(t, secrets)
	// find walks by descriptor too, so the deep branch is in its answer.
	b, err := exec.Command("find", app, "(", "!", "-user", "1000", "-o", "!", "-type", "l", "-perm", "/7022", "-o", "-type", "p", ")", "-print").CombinedOutput()
	if err != nil || len(b) > 0 {
		t.Errorf("not handed back (%v; %s): %.2000s", err, swaps, b)
	}
	n, err := exec.Command("sh", "-c", "find "+app+" -name suid | wc -l").Output()
	if err != nil || strings.TrimSpace(string(n)) != "3" {
		t.Errorf("found %q set-uid copies, want the task's 3 (deep one included): %v", n, err)
	}
}

// testWorkspaceSwap: the workspace's owner swaps the workspace for a link
// to a host directory in a loop while tasks start on it. The check looked
// at the path and the runtime bound it later, following the link: a task
// got the link's target read-write. Now each task gets the workspace or
// does not start, and says why.
func testWorkspaceSwap(t *testing.T, rt escapeRuntime) {
	testenv.RequireRoot(t)
	repos, app, secrets := workspaceRoot(t)
	if err := os.WriteFile(filepath.Join(app, "MINE"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s := MustStart(t, func(c *config.Config) {
		rt.config(t)(c)
		c.Workspaces.Roots = []string{repos}
	})
	ctx := context.Background()
	// The workspace is a link a fifth of the time.
	racer := startSwapper(t, repos, "-target", secrets, "-hold", "1ms", "-pause", "4ms", "app")
	// Twelve attempts at least, and on until three tasks have started:
	// a refused spawn takes no time, so a fixed count could all fall
	// within one of the racer's holds when the machine stalls it (12
	// refused over 5 swaps in one CI run).
	started, refused := 0, 0
	deadline := time.Now().Add(90 * time.Second)
	for attempt := 0; (attempt < 12 || started < 3) && time.Now().Before(deadline); attempt++ {
		tk, _, err := s.client.Spawn(ctx, service.SpawnRequest{TaskDescription: "look around", Agent: "command",
			Runtime: rt.runtime, Workspace: app, Command: []string{"sh", "-c", "ls -a > /task/output/seen; touch written-by-task"}})
		if err != nil {
			// The workspace was a link when the spawn checked it.
			if !strings.Contains(err.Error(), "is a symbolic link") {
				t.Errorf("spawn: %v, want success or a refusal for the link", err)
			}
			refused++
			time.Sleep(3 * time.Millisecond)
			continue
		}
		res := s.wait(t, tk.ID, 120*time.Second, "seen")
		if res.Status != task.Success {
			// Refused at the task's preparation (the workspace's check,
			// or its open for the git snapshot) or at its sandbox's start
			// (the pin's).
			if !strings.Contains(res.ErrorMessage, "is a symbolic link") && !strings.Contains(res.ErrorMessage, "was replaced while it was opened") &&
				!strings.Contains(res.ErrorMessage, "no longer a directory") {
				t.Errorf("task %s: %s %q, want success or a start refused for the link", tk.ID, res.Status, res.ErrorMessage)
			}
			refused++
			continue
		}
		started++
		seen := res.FileContents["seen"].Content
		if !strings.Contains(seen, "MINE") || strings.Contains(seen, "shadow") {
			t.Errorf("task %s saw %q in its workspace, want the workspace's files", tk.ID, seen)
		}
	}
	swaps := stopSwapper(t, racer)
	checkSecrets(t, secrets)
	if _, err := os.Stat(filepath.Join(secrets, "written-by-task")); err == nil {
		t.Errorf("a task wrote into the link's target")
	}
	if started == 0 {
		t.Errorf("%d tasks started, %d refused, %s: the race did not happen", started, refused, swaps)
	}
	t.Logf("%d started, %d refused, %s", started, refused, swaps)
}

// testOwnIdentities: two tasks run at once; each sandbox runs as a host
// identity of its own, and one's identity is refused at the other's task
// directory, as a process that escaped its sandbox's namespaces would be.
// Before, every sandbox ran as one identity, which owned every running
// task's and session's directory: one escape reached them all.
func testOwnIdentities(t *testing.T, rt escapeRuntime) {
	testenv.RequireRoot(t)
	s := MustStart(t, rt.config(t))
	script := `echo secret > output/secret.txt && : > output/go && while [ -e output/go ]; do sleep 0.05; done`
	var ids [2]string
	for i := range ids {
		tk := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "hold a secret", Agent: "command", Runtime: rt.runtime,
			Command: []string{"sh", "-c", script}})
		ids[i] = tk.ID
	}
	var uids [2]uint32
	for i, id := range ids {
		dir := filepath.Join(s.data, "tasks", id)
		waitFor(t, "the worker holding its secret", func() bool {
			_, err := os.Stat(filepath.Join(dir, "output", "go"))
			return err == nil
		})
		fi, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		uids[i] = fi.Sys().(*syscall.Stat_t).Uid
		if fi.Mode().Perm() != 0o700 {
			t.Errorf("task %s's directory is %v while its sandbox runs, want 0700", id, fi.Mode().Perm())
		}
	}
	if uids[0] == uids[1] {
		t.Fatalf("two sandboxes run as one host identity, %d", uids[0])
	}
	secret := filepath.Join(s.data, "tasks", ids[0], "output", "secret.txt")
	as := func(uid uint32, args ...string) (string, error) {
		cmd := exec.Command(args[0], args[1:]...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: hostuser.Reserved, Groups: []uint32{}}}
		b, err := cmd.CombinedOutput()
		return string(b), err
	}
	// The control: the first sandbox's identity reads its own secret.
	if out, err := as(uids[0], "cat", secret); err != nil || out != "secret\n" {
		t.Fatalf("the first sandbox's identity reading its own secret: %q %v", out, err)
	}
	for _, try := range [][]string{{"cat", secret}, {"ls", filepath.Join(s.data, "tasks", ids[0])}, {"touch", filepath.Join(s.data, "tasks", ids[0], "output", "x")}} {
		if out, err := as(uids[1], try...); err == nil || !strings.Contains(out, "Permission denied") {
			t.Errorf("the second sandbox's identity: %v: %q %v, want permission denied", try, out, err)
		}
	}
	for _, id := range ids {
		os.Remove(filepath.Join(s.data, "tasks", id, "output", "go"))
		if res := s.wait(t, id, 60*time.Second); res.Status != task.Success {
			t.Errorf("task %s: %s %s", id, res.Status, res.ErrorMessage)
		}
	}
}

// TestWorkspaceHooks: a task leaves a pre-commit hook, changes an existing
// hook and sets core.fsmonitor in its workspace's repository, all of which
// git would run as the workspace's owner at their next command. Once its
// sandbox is gone the hooks are listed in its result and not executable
// any more, the owner's own hook is untouched, and the configuration key
// is listed; with workspaces.allow_hooks the hooks are listed and left.
func TestWorkspaceHooks(t *testing.T) {
	t.Parallel()
	for _, allow := range []bool{false, true} {
		s := MustStart(t, func(c *config.Config) { c.Workspaces.AllowHooks = allow })
		ctx := context.Background()
		if _, err := s.client.CreateProject(ctx, service.CreateProjectRequest{Name: "app", InitGit: true}); err != nil {
			t.Fatal(err)
		}
		hooks := filepath.Join(s.data, "projects", "app", ".git", "hooks")
		for name, body := range map[string]string{"pre-push": "#!/bin/sh\necho owner\n", "post-checkout": "#!/bin/sh\necho owner\n"} {
			if err := os.WriteFile(filepath.Join(hooks, name), []byte(body), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		script := `printf '#!/bin/sh\necho pwned\n' > .git/hooks/pre-commit && chmod 755 .git/hooks/pre-commit &&
printf '#!/bin/sh\necho pwned\n' > .git/hooks/post-checkout && printf '[core]\n\tfsmonitor = /tmp/x\n' >> .git/config`
		tk := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "leave hooks", Workspace: "app", Agent: "command", Command: []string{"sh", "-c", script}})
		s.waitSuccess(t, tk.ID, 60*time.Second)
		var got *task.WorkspaceGit
		waitFor(t, "the workspace's repository checked", func() bool {
			tk, err := s.client.Get(ctx, tk.ID)
			got = tk.WorkspaceGit
			return err == nil && got != nil
		})
		if !slices.Equal(got.Hooks, []string{"post-checkout", "pre-commit"}) || got.HooksDisabled == allow || !slices.Equal(got.Config, []string{"core.fsmonitor"}) {
			t.Errorf("allow %v: the result's workspace_git %+v, want the two hooks (disabled: %v) and core.fsmonitor", allow, got, !allow)
		}
		for name, wantX := range map[string]bool{"pre-commit": allow, "post-checkout": allow, "pre-push": true} {
			fi, err := os.Stat(filepath.Join(hooks, name))
			if err != nil {
				t.Fatal(err)
			}
			if x := fi.Mode().Perm()&0o111 != 0; x != wantX {
				t.Errorf("allow %v: %s executable %v, want %v", allow, name, x, wantX)
			}
		}
	}
}
