package hostuser

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/testenv"
	"golang.org/x/sys/unix"
)

// person is the workspace's owner in these tests: an unprivileged uid.
const person = 1000

// What a sandbox leaves in a workspace under an operator's root, as its
// identity: a top and subdirectories anyone may write, a large directory
// to slow the walk, a set-uid file, and directories below it.
func leaveWorkspace(t *testing.T, ws string, files int) {
	t.Helper()
	for _, d := range []string{"a", "a/b", "a/b/c", "big", "z", "z/y"} {
		if err := os.MkdirAll(filepath.Join(ws, d), 0o777); err != nil {
			t.Fatal(err)
		}
	}
	for i := range files {
		if err := os.WriteFile(filepath.Join(ws, "big", fmt.Sprintf("f%05d", i)), nil, 0o666); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"a/b/c/suid", "z/y/suid"} {
		if err := os.WriteFile(filepath.Join(ws, f), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	err := filepath.Walk(ws, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		mode := os.FileMode(0o666)
		if fi.IsDir() {
			mode = os.ModeSticky | 0o777
		} else if strings.HasSuffix(p, "suid") {
			mode = os.ModeSetuid | os.ModeSetgid | 0o777
		}
		if err := os.Lchown(p, Reserved, Reserved); err != nil {
			return err
		}
		return os.Chmod(p, mode)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// secrets are host files the owner must never come to own: a root-only
// file and a directory, outside the workspace.
func secrets(t *testing.T) (dir string, check func()) {
	t.Helper()
	dir = filepath.Join(testenv.TempDir(t), "etc")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	shadow := filepath.Join(dir, "shadow")
	if err := os.WriteFile(shadow, []byte("root:x"), 0o640); err != nil {
		t.Fatal(err)
	}
	return dir, func() {
		t.Helper()
		for p, mode := range map[string]os.FileMode{dir: os.ModeDir | 0o755, filepath.Join(dir, "sub"): os.ModeDir | 0o755, shadow: 0o640} {
			fi, err := os.Lstat(p)
			if err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 || st.Gid != 0 || fi.Mode() != mode {
				t.Fatalf("%s is %d:%d %v after Reclaim: the walk left the workspace", p, st.Uid, st.Gid, fi.Mode())
			}
		}
	}
}

// checkHandedBack fails unless every entry under ws is the person's and
// carries no set-id, sticky or group/other write bit.
func checkHandedBack(t *testing.T, ws string) {
	t.Helper()
	err := filepath.Walk(ws, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != person || (fi.Mode()&os.ModeSymlink == 0 && fi.Mode()&unsafeBits != 0) {
			return fmt.Errorf("%s is %d:%d %v after Reclaim", p, st.Uid, st.Gid, fi.Mode())
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
}

// The owner of a workspace races the hand-back: a process of theirs swaps
// every directory of the workspace, and the workspace itself, with links
// to a host directory (and back), in a loop, from before the hand-back
// starts until it has ended. Before, the walk gave the top back first and
// followed a swapped link as an intermediate component: the owner came to
// own the host's files. Now nothing outside the workspace changes, and the
// workspace is handed back whole, round after round.
func TestReclaimOwnerRaces(t *testing.T) {
	testenv.RequireRoot(t)
	rounds := 12
	if testing.Short() {
		rounds = 3
	}
	// The test binary, where the owner can run it.
	bin := filepath.Join(testenv.TempDir(t), "hostuser.test")
	b, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	for round := range rounds {
		root := testenv.TempDir(t)
		if err := os.Chown(root, person, person); err != nil {
			t.Fatal(err)
		}
		ws := filepath.Join(root, "ws")
		if err := os.Mkdir(ws, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(ws, person, person); err != nil {
			t.Fatal(err)
		}
		// As a runtime does: the workspace pinned, and the pin given.
		pins := filepath.Join(testenv.TempDir(t), "pins")
		spec, err := Pin(sandbox.Spec{Mounts: []sandbox.Mount{{Source: ws, Target: "/w", HostDir: true}}}, pins, Identity{Reserved, Reserved})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { Unpin(pins) })
		trees, err := Give([]string{spec.Mounts[0].Source}, Identity{Reserved, Reserved})
		if err != nil {
			t.Fatal(err)
		}
		leaveWorkspace(t, ws, 3000)
		outside, check := secrets(t)

		racer := exec.Command(bin, "-test.run=^TestOwnerRacer$")
		racer.Env = append(os.Environ(), "CORRAL_TEST_RACER="+root, "CORRAL_TEST_RACER_TARGET="+outside)
		racer.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: person, Gid: person, Groups: []uint32{}}}
		pipe, err := racer.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		racer.Stderr = os.Stderr
		if err := racer.Start(); err != nil {
			t.Fatal(err)
		}
		// The racer says "swapping" once it has made its first exchange:
		// a fixed sleep here was too short for a loaded machine.
		lines := bufio.NewReader(pipe)
		if l, err := lines.ReadString('\n'); l != "swapping\n" {
			racer.Process.Kill()
			racer.Wait()
			t.Fatalf("round %d: the racer said %q, %v", round, l, err)
		}
		err = Reclaim(trees)
		time.Sleep(20 * time.Millisecond) // the racer goes on after the top is back
		racer.Process.Signal(syscall.SIGTERM)
		rest, _ := io.ReadAll(lines)
		racer.Wait()
		out := string(rest)
		var n int
		if _, err := fmt.Sscanf(out, "swaps %d", &n); err != nil || n == 0 {
			t.Fatalf("round %d: the racer swapped nothing: %q", round, out)
		}
		check()
		if err != nil {
			t.Fatalf("round %d: Reclaim: %v (racer: %s)", round, err, out)
		}
		if err := Unpin(pins); err != nil {
			t.Fatal(err)
		}
		// The racer may have left the workspace renamed or swapped: find
		// it again where its last exchange put it.
		if fi, err := os.Lstat(ws); err != nil || !fi.IsDir() {
			os.Rename(filepath.Join(root, "decoy-ws"), ws)
		}
		checkHandedBack(t, ws)
	}
}

// TestOwnerRacer is TestReclaimOwnerRaces's racer, run as the workspace's
// owner: it exchanges each directory of the workspace under
// $CORRAL_TEST_RACER with a link to $CORRAL_TEST_RACER_TARGET, and back,
// until it is killed.
func TestOwnerRacer(t *testing.T) {
	root := os.Getenv("CORRAL_TEST_RACER")
	if root == "" {
		t.Skip("TestReclaimOwnerRaces's helper")
	}
	target := os.Getenv("CORRAL_TEST_RACER_TARGET")
	paths := []string{"ws", "ws/a", "ws/a/b", "ws/a/b/c", "ws/big", "ws/z", "ws/z/y"}
	for _, p := range paths {
		// A link beside each directory, where the owner can write (the
		// root is theirs; the workspace's directories are writable to
		// all until the hand-back closes them).
		os.Symlink(target, filepath.Join(root, filepath.Dir(p), "decoy-"+filepath.Base(p)))
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM)
	for swaps := 0; ; {
		select {
		case <-stop:
			fmt.Printf("swaps %d\n", swaps)
			os.Exit(0)
		default:
		}
		for _, p := range paths {
			a, b := filepath.Join(root, p), filepath.Join(root, filepath.Dir(p), "decoy-"+filepath.Base(p))
			if unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE) == nil {
				if swaps++; swaps == 1 {
					fmt.Println("swapping")
				}
				unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE)
			}
		}
	}
}

// A task nests directories far past PATH_MAX (4096), each made relative to
// the one before as a worker can, and deeper than the walk keeps
// descriptors open, then leaves a set-uid file and a directory anyone may
// write at the bottom and after the deep branch. The walk used paths and
// stopped at ENAMETOOLONG, leaving what came after the sandbox's; now it
// hands back all of it.
func TestReclaimDeepPath(t *testing.T) {
	testenv.RequireRoot(t)
	ws, trees := givenWorkspace(t)
	name := strings.Repeat("d", 200)
	depth := keepOpen*2 + 10 // about 27,000 bytes of path
	fd, err := unix.Open(ws, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for range depth {
		if err := unix.Mkdirat(fd, name, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fchownat(fd, name, Reserved, Reserved, 0); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(fd)
		fd = next
	}
	leaveAt(t, fd)
	unix.Close(fd)
	// After the deep branch in the walk's order ("z" > "ddd...").
	if err := os.Mkdir(filepath.Join(ws, "z"), 0o777); err != nil {
		t.Fatal(err)
	}
	fd, err = unix.Open(filepath.Join(ws, "z"), unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	leaveAt(t, fd)
	unix.Close(fd)
	if err := os.Lchown(filepath.Join(ws, "z"), Reserved, Reserved); err != nil {
		t.Fatal(err)
	}

	if err := Reclaim(trees); err != nil {
		t.Fatalf("Reclaim: %v", err)
	}
	// Check every entry by descriptor: no path reaches the bottom.
	top, err := unix.Open(ws, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(top)
	seen := 0
	check := func(fd int, name string, st *unix.Stat_t) error {
		seen++
		if st.Uid != person || st.Mode&unsafeMode != 0 {
			return fmt.Errorf("%q is %d:%d %o", name, st.Uid, st.Gid, st.Mode)
		}
		return nil
	}
	err = walkTree(top, ws, visitor{
		enter: func(fd int, st *unix.Stat_t) error { return check(fd, "a directory", st) },
		leave: func(int, *unix.Stat_t) error { return nil },
		entry: check,
	})
	if err != nil {
		t.Error(err)
	}
	if want := 1 + depth + 2 + 1 + 2; seen != want {
		t.Errorf("walked %d entries, want %d", seen, want)
	}
}

// givenWorkspace is a person's workspace given to the sandbox identity.
func givenWorkspace(t *testing.T) (string, []Tree) {
	t.Helper()
	ws := filepath.Join(testenv.TempDir(t), "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(ws, person, person); err != nil {
		t.Fatal(err)
	}
	trees, err := Give([]string{ws}, Identity{Reserved, Reserved})
	if err != nil {
		t.Fatal(err)
	}
	return ws, trees
}

// leaveAt leaves a set-uid file and a 1777 directory, the sandbox's, in
// the directory open at fd.
func leaveAt(t *testing.T, fd int) {
	t.Helper()
	f, err := unix.Openat(fd, "suid", unix.O_CREAT|unix.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(f)
	if err := unix.Mkdirat(fd, "tmp", 0o777); err != nil {
		t.Fatal(err)
	}
	for name, mode := range map[string]uint32{"suid": unix.S_ISUID | 0o755, "tmp": unix.S_ISVTX | 0o777} {
		if err := unix.Fchownat(fd, name, Reserved, Reserved, 0); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fchmodat(fd, name, mode, 0); err != nil {
			t.Fatal(err)
		}
	}
}

// An entry the walk cannot take back (here, on a read-only mount inside
// the workspace) does not stop it, and the workspace is quarantined: its
// top is left to the server alone, and Reclaim says so.
func TestReclaimQuarantines(t *testing.T) {
	testenv.RequireRoot(t)
	ws, trees := givenWorkspace(t)
	ro := filepath.Join(ws, "a-ro")
	if err := os.Mkdir(ro, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", ro, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Unmount(ro, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(ro, "f"), nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(filepath.Join(ro, "f"), Reserved, Reserved); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("", ro, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	later := filepath.Join(ws, "z-suid")
	if err := os.WriteFile(later, nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(later, Reserved, Reserved); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(later, os.ModeSetuid|0o755); err != nil {
		t.Fatal(err)
	}

	err := Reclaim(trees)
	if !errors.Is(err, sandbox.ErrQuarantined) || !errors.Is(err, unix.EROFS) {
		t.Fatalf("Reclaim = %v, want ErrQuarantined naming the read-only entry", err)
	}
	fi, err := os.Stat(ws)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 0 || fi.Mode().Perm() != 0o700 {
		t.Errorf("quarantined workspace is %d %v, want the server's, 0700", st.Uid, fi.Mode())
	}
	// The walk went on past the failure.
	fi, err = os.Stat(later)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != person || fi.Mode()&os.ModeSetuid != 0 {
		t.Errorf("an entry after the failure is %d %v: the walk stopped", st.Uid, fi.Mode())
	}
}

// A person owning a workspace root exchanges the workspace with a link to
// another directory (another task's, say) in a loop while sandboxes start
// on it. The check and the bind each looked the path up, so a sandbox got
// the link's target; now the directory is held from the check on, and a
// pin is the workspace or nothing, start after start.
func TestPinSwap(t *testing.T) {
	testenv.RequireRoot(t)
	root := testenv.TempDir(t)
	ws, other := filepath.Join(root, "ws"), filepath.Join(testenv.TempDir(t), "other-task")
	for _, d := range []string{ws, other} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(other, filepath.Join(root, "decoy")); err != nil {
		t.Fatal(err)
	}
	var want unix.Stat_t
	if err := unix.Stat(ws, &want); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	swapped := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-done:
				swapped <- n
				return
			default:
			}
			if unix.Renameat2(unix.AT_FDCWD, ws, unix.AT_FDCWD, filepath.Join(root, "decoy"), unix.RENAME_EXCHANGE) == nil {
				n++
			}
		}
	}()
	pinned, refused := 0, 0
	for i := range 300 {
		pins := filepath.Join(testenv.TempDir(t), "pins")
		spec, err := Pin(sandbox.Spec{Mounts: []sandbox.Mount{{Source: ws, Target: "/w", HostDir: true}}}, pins, Identity{Reserved, Reserved})
		if err != nil {
			if !strings.Contains(err.Error(), "no longer a directory") {
				t.Fatalf("start %d: %v", i, err)
			}
			refused++
			continue
		}
		var st unix.Stat_t
		if err := unix.Stat(spec.Mounts[0].Source, &st); err != nil {
			t.Fatal(err)
		}
		if st.Dev != want.Dev || st.Ino != want.Ino {
			t.Fatalf("start %d: the pin is not the workspace (inode %d, want %d)", i, st.Ino, want.Ino)
		}
		pinned++
		if err := Unpin(pins); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	if n := <-swapped; n == 0 || pinned == 0 || refused == 0 {
		t.Fatalf("%d swaps, %d pinned, %d refused: the race did not happen", n, pinned, refused)
	}
}

// Unpin detaches each pin before removing its mount point, and never
// removes what a pin shows: the workspace's files stay.
func TestUnpinKeepsTheWorkspace(t *testing.T) {
	testenv.RequireRoot(t)
	ws := filepath.Join(testenv.TempDir(t), "ws")
	if err := os.Mkdir(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "main.go"), []byte("package main"), 0o644); err != nil {
		t.Fatal(err)
	}
	pins := filepath.Join(testenv.TempDir(t), "pins")
	asked := sandbox.Spec{Mounts: []sandbox.Mount{{Source: "tasks/t1", Target: "/t"}, {Source: ws, Target: "/w", HostDir: true}}}
	spec, err := Pin(asked, pins, Identity{Reserved, Reserved})
	if err != nil {
		t.Fatal(err)
	}
	if spec.Mounts[0].Source != "tasks/t1" || spec.Mounts[1].Source != filepath.Join(pins, "1") {
		t.Fatalf("pinned mounts %+v", spec.Mounts)
	}
	if _, err := os.Stat(filepath.Join(spec.Mounts[1].Source, "main.go")); err != nil {
		t.Fatalf("the pin does not show the workspace: %v", err)
	}
	if err := Unpin(pins); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pins); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pins left: %v", err)
	}
	if _, err := os.Stat(filepath.Join(ws, "main.go")); err != nil {
		t.Errorf("Unpin removed the workspace's files: %v", err)
	}
	// A workspace the sandbox identity holds is another sandbox's.
	if err := os.Chown(ws, Reserved, Reserved); err != nil {
		t.Fatal(err)
	}
	if asked.Mounts[1].Source != ws {
		t.Errorf("Pin changed the spec it was given")
	}
	if _, err := Pin(asked, pins, Identity{Reserved, Reserved}); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("Pin of a held workspace = %v, want a conflict", err)
	}
}

// A server killed in the middle of a hand-back (its process SIGKILLed
// while Reclaim walks) leaves the tree partly the owner's; the next
// server's Reclaim of the same recorded trees finishes it: every entry the
// owner's, no unsafe bit, nothing outside changed.
func TestReclaimAfterKill(t *testing.T) {
	testenv.RequireRoot(t)
	bin := filepath.Join(testenv.TempDir(t), "hostuser.test")
	b, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cut := 0
	for round := range 3 {
		ws, trees := givenWorkspace(t)
		leaveWorkspace(t, ws, 20000)
		_, check := secrets(t)
		state, err := json.Marshal(trees)
		if err != nil {
			t.Fatal(err)
		}
		killed := exec.Command(bin, "-test.run=^TestReclaimHelper$")
		killed.Env = append(os.Environ(), "CORRAL_TEST_RECLAIM="+string(state))
		if err := killed.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(20+round*30) * time.Millisecond)
		killed.Process.Kill()
		err = killed.Wait()
		t.Logf("round %d: the first hand-back: %v", round, err)
		// The top goes back last: still the sandbox's, the walk was cut.
		if fi, err := os.Stat(ws); err == nil && fi.Sys().(*syscall.Stat_t).Uid != person {
			cut++
		}
		var again []Tree
		if err := json.Unmarshal(state, &again); err != nil {
			t.Fatal(err)
		}
		if err := Reclaim(again); err != nil {
			t.Fatalf("round %d: the hand-back after the kill: %v", round, err)
		}
		check()
		checkHandedBack(t, ws)
	}
	if cut == 0 {
		t.Errorf("no kill cut a hand-back short: the test proves nothing here")
	}
}

// TestReclaimHelper is TestReclaimAfterKill's first server: it hands back
// the trees in $CORRAL_TEST_RECLAIM until it is killed.
func TestReclaimHelper(t *testing.T) {
	state := os.Getenv("CORRAL_TEST_RECLAIM")
	if state == "" {
		t.Skip("TestReclaimAfterKill's helper")
	}
	var trees []Tree
	if err := json.Unmarshal([]byte(state), &trees); err != nil {
		t.Fatal(err)
	}
	Reclaim(trees)
}
