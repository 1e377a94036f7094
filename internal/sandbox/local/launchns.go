//go:build linux

package local

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/corral-dev/corral/internal/sandbox"
	"golang.org/x/sys/unix"
)

// launchNS starts sandboxes' launchers in a mount namespace of the
// server's own that shows only what sandboxes are built from: /usr, /etc,
// /dev, /proc, the top-level /bin and /lib* links, the state directory,
// the data root and the host roots, at their host paths, on an empty root.
//
// Why: bwrap (0.8, Debian 12's) reads the whole mount table,
// /proc/self/mountinfo, once for every bind it makes, 44 times for a task's
// sandbox, and until it has built the sandbox's root that table holds every
// mount of the namespace bwrap started in. On a host with many mounts (a
// container engine's layers, a node's pod volumes, snaps) each sandbox's
// start read all of them 44 times: with 200 more mounts on this machine,
// Create→Wait took 30 ms instead of 10 (BenchmarkStartHostMounts).
//
// The namespace belongs to one OS thread, locked to the goroutine that made
// it (a process forked from that thread starts in it; the server's other
// threads never enter it). It is a slave of the host's: what the host
// unmounts leaves it too, and nothing done in it reaches the host. What the
// host mounts later does not always show in it (not at all where the host's
// mounts are private), so a launcher starts in it only when every file its
// sandbox binds is the same file there as on the host; otherwise it starts
// from the server's own namespace, as it would without one.
type launchNS struct {
	reqs     chan launchReq
	stop     chan struct{}
	stopOnce sync.Once
}

type launchReq struct {
	cmd   *exec.Cmd
	paths []string
	ids   []fileID // paths as the host sees them
	done  chan launchResult
}

type launchResult struct {
	started bool // false: some path differs there, and cmd was not started
	err     error
}

// fileID identifies a file across mount namespaces: the same file has the
// same device and inode in both.
type fileID struct{ dev, ino uint64 }

func statID(path string) (fileID, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{st.Dev, st.Ino}, nil
}

// launchRoot is a host directory the launch namespace shows, with its
// submounts (rec) or without.
type launchRoot struct {
	path string
	rec  bool
}

// launchRoots returns the directories a launch namespace for opts shows,
// those already shown by another left out. The data root "/" (the
// conformance suite's) is left out, or the namespace would be the host's
// again: what is bound from elsewhere starts from the host's namespace.
func launchRoots(opts Options, bwrap string) []launchRoot {
	roots := []launchRoot{{"/usr", true}, {"/etc", true}, {"/dev", false}, {"/proc", false}, {opts.StateDir, true}}
	for _, d := range append([]string{opts.DataRoot}, opts.HostRoots...) {
		if d = filepath.Clean(d); d != "/" && filepath.IsAbs(d) {
			roots = append(roots, launchRoot{d, true})
		}
	}
	if bwrap != "" {
		roots = append(roots, launchRoot{filepath.Dir(bwrap), true})
	}
	for _, e := range systemDirs() {
		if e.link == "" {
			roots = append(roots, launchRoot{e.path, true})
		}
	}
	slices.SortFunc(roots, func(a, b launchRoot) int { return strings.Compare(a.path, b.path) })
	var out []launchRoot
	for _, r := range roots {
		if !slices.ContainsFunc(out, func(o launchRoot) bool { return sandbox.Within(r.path, o.path) && (o.rec || o.path == r.path) }) {
			out = append(out, r)
		}
	}
	return out
}

// newLaunchNS makes a launch namespace showing roots; it needs
// CAP_SYS_ADMIN.
func newLaunchNS(roots []launchRoot) (*launchNS, error) {
	l := &launchNS{reqs: make(chan launchReq), stop: make(chan struct{})}
	ready := make(chan error, 1)
	go l.serve(roots, ready)
	if err := <-ready; err != nil {
		return nil, err
	}
	return l, nil
}

// serve builds the namespace on its thread, then starts what it is sent
// there until close. The thread is never unlocked: when serve returns, Go
// ends the thread instead of reusing it elsewhere. It is never the
// process's main thread: /proc/self is the main thread's, and would show
// every thread of the server the launch namespace's mounts.
func (l *launchNS) serve(roots []launchRoot, ready chan<- error) {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		// Held meanwhile, the main thread cannot be the one the next
		// goroutine locks.
		locked := make(chan struct{})
		go func() {
			runtime.LockOSThread()
			close(locked)
			l.enter(roots, ready)
		}()
		<-locked
		runtime.UnlockOSThread()
		return
	}
	l.enter(roots, ready)
}

func (l *launchNS) enter(roots []launchRoot, ready chan<- error) {
	if err := enterLaunchRoot(roots); err != nil {
		ready <- err
		return
	}
	ready <- nil
	for {
		select {
		case req := <-l.reqs:
			req.done <- l.run(req)
		case <-l.stop:
			return
		}
	}
}

func (l *launchNS) run(req launchReq) launchResult {
	for i, p := range req.paths {
		if id, err := statID(p); err != nil || id != req.ids[i] {
			return launchResult{}
		}
	}
	return launchResult{started: true, err: req.cmd.Start()}
}

// start starts cmd in the namespace if each of paths is the same file there
// as on the host, and reports whether it tried; if not, cmd is untouched.
func (l *launchNS) start(cmd *exec.Cmd, paths []string) (bool, error) {
	ids := make([]fileID, len(paths))
	for i, p := range paths {
		id, err := statID(p)
		if err != nil {
			return false, nil // a missing source is for bwrap to report
		}
		ids[i] = id
	}
	done := make(chan launchResult, 1)
	select {
	case l.reqs <- launchReq{cmd: cmd, paths: paths, ids: ids, done: done}:
		res := <-done
		return res.started, res.err
	case <-l.stop:
		return false, nil
	}
}

// close ends the namespace's thread; start then declines.
func (l *launchNS) close() { l.stopOnce.Do(func() { close(l.stop) }) }

// launchTop is where the namespace's root is built before it becomes the
// root: /sys, which no sandbox binds from, so covering it there hides
// nothing a root needs.
const launchTop = "/sys"

// enterLaunchRoot moves the calling thread into a new mount namespace whose
// root shows only roots (and the top-level links of systemDirs).
func enterLaunchRoot(roots []launchRoot) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("unshare the mount namespace: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("make the namespace a slave of the host's: %w", err)
	}
	if err := unix.Mount("corral-launch", launchTop, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=1m"); err != nil {
		return fmt.Errorf("mount the launch root: %w", err)
	}
	for _, r := range roots {
		fi, err := os.Stat(r.path)
		if err != nil || !fi.IsDir() {
			continue // not on this host (say /lib32): nothing binds from it
		}
		if err := mirrorDirs(r.path); err != nil {
			return err
		}
		flags := uintptr(unix.MS_BIND)
		if r.rec {
			flags |= unix.MS_REC
		}
		if err := unix.Mount(r.path, launchTop+r.path, "", flags, ""); err != nil {
			return fmt.Errorf("bind %s: %w", r.path, err)
		}
	}
	for _, e := range systemDirs() {
		if e.link != "" {
			if err := os.Symlink(e.link, launchTop+e.path); err != nil {
				return fmt.Errorf("link %s: %w", e.path, err)
			}
		}
	}
	// bwrap mounts the tmpfs it builds a sandbox's root in over /tmp.
	if err := mirrorDirs("/tmp"); err != nil {
		return err
	}
	old := launchTop + "/.host"
	if err := os.Mkdir(old, 0o700); err != nil {
		return err
	}
	if err := unix.PivotRoot(launchTop, old); err != nil {
		return fmt.Errorf("pivot into the launch root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Unmount("/.host", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host's root: %w", err)
	}
	return os.Remove("/.host")
}

// mirrorDirs makes path and its parents under launchTop, each with the
// mode and owner of the host's, so that a path is reachable there by whom
// it is on the host.
func mirrorDirs(path string) error {
	p := "/"
	for _, name := range strings.Split(strings.Trim(path, "/"), "/") {
		p = filepath.Join(p, name)
		if _, err := os.Lstat(launchTop + p); err == nil {
			continue
		}
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		if err := os.Mkdir(launchTop+p, 0o700); err != nil {
			return err
		}
		if err := errors.Join(os.Lchown(launchTop+p, int(st.Uid), int(st.Gid)), os.Chmod(launchTop+p, fi.Mode()&(os.ModePerm|os.ModeSticky|os.ModeSetgid))); err != nil {
			return err
		}
	}
	return nil
}

// bindSources are the host paths bwrap's arguments args bind from, those
// under /proc and /dev left out (the namespace shows the host's own procfs
// and devtmpfs). It stops at "--": what follows is the sandbox's command.
func bindSources(args []string) []string {
	var paths []string
	for i := 0; i < len(args)-1 && args[i] != "--"; i++ {
		if a := args[i]; a == "--bind" || a == "--ro-bind" {
			if p := args[i+1]; !sandbox.Within(p, "/proc") && !sandbox.Within(p, "/dev") {
				paths = append(paths, p)
			}
		}
	}
	return paths
}
