//go:build linux

package local

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/cgroups"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
)

// systemDir is one of the host's top-level system directories (/bin,
// /sbin, /lib*): a symlink to link where /usr is merged, else (link "")
// a directory.
type systemDir struct{ path, link string }

// systemDirs are the host's top-level system directories, looked at once,
// not at every sandbox's start.
var systemDirs = sync.OnceValue(func() []systemDir {
	var dirs []systemDir
	for _, d := range []string{"/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"} {
		fi, err := os.Lstat(d)
		if err != nil {
			continue
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			if target, err := os.Readlink(d); err == nil {
				dirs = append(dirs, systemDir{d, target})
			}
			continue
		}
		if fi.IsDir() {
			dirs = append(dirs, systemDir{path: d})
		}
	}
	return dirs
})

// rootfsArgs returns the bwrap arguments for the host system directories:
// /usr read-only, and /bin, /sbin, /lib* as the same symlinks as on the host
// when /usr is merged, else read-only binds. The slice is shared (clipped,
// so an append copies it).
var rootfsArgs = sync.OnceValue(func() []string {
	args := []string{"--ro-bind", "/usr", "/usr"}
	for _, d := range systemDirs() {
		if d.link != "" {
			args = append(args, "--symlink", d.link, d.path)
		} else {
			args = append(args, "--ro-bind", d.path, d.path)
		}
	}
	return slices.Clip(args)
})

// procArgs are the bwrap arguments that mask and protect /proc entries,
// after --proc /proc. Read-only entries are the host's own /proc entries
// bound read-only (the same tables: the sandbox's /proc shows them too).
// Which entries this kernel has is looked at once; the slice is shared.
var procArgs = sync.OnceValue(func() []string {
	var args []string
	for _, name := range sandbox.ProcMasked {
		if _, err := os.Lstat("/proc/" + name); err == nil {
			args = append(args, "--ro-bind", "/dev/null", "/proc/"+name)
		}
	}
	for _, name := range sandbox.ProcMaskedDirs {
		if _, err := os.Lstat("/proc/" + name); err == nil {
			args = append(args, "--tmpfs", "/proc/"+name, "--remount-ro", "/proc/"+name)
		}
	}
	for _, name := range sandbox.ProcReadOnly {
		if _, err := os.Lstat("/proc/" + name); err == nil {
			args = append(args, "--ro-bind", "/proc/"+name, "/proc/"+name)
		}
	}
	return slices.Clip(args)
})

// seccompFD is the descriptor bwrap reads the seccomp filter from (3 is
// --json-status-fd). bwrap closes it before it runs the main process.
const seccompFD = 4

// hardeningArgs are the bwrap arguments that take privileges away: every
// capability, including the bounding set, so nothing the sandbox runs can
// gain one (bwrap already sets no_new_privs); and the seccomp filter, which
// bwrap installs last, just before it execs the main process.
func hardeningArgs() []string {
	return []string{"--cap-drop", "ALL", "--seccomp", strconv.Itoa(seccompFD)}
}

// bwrapArgs builds bwrap's arguments (without the program name) for spec.
// etcDir is the generated /etc, etcBinds the host entries bound over it.
func bwrapArgs(spec sandbox.Spec, o Options, etcDir string, etcBinds []string) []string {
	args := []string{
		"--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
		// NetworkEgress too gets a private network namespace with only
		// loopback: the egress proxy is reached through a Unix socket
		// the caller mounts (under /run/corral), never the host network.
		"--unshare-net",
		"--uid", strconv.Itoa(o.UID), "--gid", strconv.Itoa(o.GID),
		"--hostname", "corral",
		"--new-session",
		// Kills the sandbox's pid 1, and so every process in it, when the
		// main process has exited (bwrap then exits) or the launcher dies.
		"--die-with-parent",
		"--json-status-fd", "3",
	}
	args = append(args, hardeningArgs()...)
	args = append(args, rootfsArgs()...)
	// The sandbox's pid 1 is bwrap's reaper, with the sandbox's uid and
	// dumpable, started with the worker's environment: its memory and
	// environment are masked (sandbox.Pid1Masked). /dev/null from a nodev
	// mount cannot even be opened.
	args = append(args, "--proc", "/proc")
	for _, n := range sandbox.Pid1Masked {
		args = append(args, "--ro-bind", "/dev/null", "/proc/1/"+n)
	}
	args = append(args, procArgs()...)
	args = append(args,
		"--dev", "/dev",
		"--size", strconv.FormatInt(o.TmpSize, 10), "--tmpfs", "/tmp",
		"--ro-bind", etcDir, "/etc",
	)
	for _, name := range etcBinds {
		args = append(args, "--ro-bind", filepath.Join("/etc", name), filepath.Join("/etc", name))
	}
	for _, m := range spec.Mounts {
		flag := "--bind"
		if m.ReadOnly {
			flag = "--ro-bind"
		}
		args = append(args, flag, m.Source, m.Target)
	}
	// The root tmpfs (holding the mount points) is made read-only last, so
	// only /tmp and read-write mounts can be written.
	args = append(args, "--remount-ro", "/")
	// No --setenv: the environment (secrets included) reaches bwrap as its
	// own environment, which only root can read in /proc, never as
	// arguments, which every host user can.
	dir := spec.Dir
	if dir == "" {
		dir = "/tmp"
	}
	args = append(args, "--chdir", dir, "--")
	return append(args, spec.Command...)
}

// launcherScript is the sandbox's launcher, run by /bin/sh: it sets the
// resource limits (soft and hard, so nothing in the sandbox can raise them:
// no core files, nofile from $1, the size of any one file from $2 in
// 512-byte blocks, as POSIX ulimit -f counts, or "unlimited"), joins the
// v1 cgroups by writing 0 (itself: echo is a builtin, so the shell, which
// has one thread and has not forked yet) into every descriptor given as an
// argument after $3 up to "--" (cgroups.Join's tasks files), closing
// each, waits at its gate when $3 is "gate": reads a line from its stdin,
// a pipe the server writes once the sandbox's state is on disk, and exits
// 125 without running anything if the pipe closes first (the server
// died), then takes /dev/null for stdin; then runs the rest (bwrap) as its
// child and exits with its status. dash takes one limit per ulimit
// command, a descriptor number from a variable only through eval (the
// numbers are the server's, never input), and none above 9: the gate is
// stdin, so that a warm sandbox's four descriptors and three v1 cgroups'
// tasks files fit.
//
// The file size limit holds for bwrap too, so it also bounds output.log,
// the sandbox's stdout and stderr: a process writing past it gets SIGXFSZ.
//
// Why a shell, not the server: the server never forks into a user
// namespace itself (Go would fork instead of vfork, and launch time would
// grow with the heap), and cannot set another process's limits without
// CAP_SYS_RESOURCE. Why bwrap is a child, not exec'd: bwrap runs with
// --die-with-parent, so when the main process exits, bwrap exits and the
// kernel kills the sandbox's pid 1 and with it every leftover process; the
// launcher is bwrap's parent, in its own session, so the server dying does
// not take bwrap (and the sandbox) with it. Paths are never part of the
// script.
const launcherScript = `ulimit -c 0 && ulimit -n "$1" && ulimit -f "$2" || exit 126; g=$3; shift 3; for fd; do [ "$fd" = -- ] && break; echo 0 >&"$fd" && eval "exec $fd>&-" || exit 126; shift; done; shift; if [ "$g" = gate ]; then read -r _ || exit 125; exec </dev/null; fi; "$@"; rc=$?; exit $rc`

// fitNoFile returns the open-file limit sandboxes get when want is asked
// for and the server's own hard RLIMIT_NOFILE is hard, and, when that is
// less than want, a warning saying so. The launcher sets the limit (soft
// and hard) as the server, and raising a hard limit takes
// CAP_SYS_RESOURCE, which a server in a container or under systemd's
// LimitNOFILE often lacks even as root: asking for more than hard failed
// every sandbox's start ("ulimit: error setting limit"). Where raising it
// would work, hard is the limit all the same: a sandbox gets no more open
// files than the operator let its server have.
func fitNoFile(want int, hard uint64) (int, string) {
	if hard == unix.RLIM_INFINITY || uint64(want) <= hard {
		return want, ""
	}
	return int(hard), fmt.Sprintf("sandboxes get %d open files, not %d: the server's hard open-file limit (RLIMIT_NOFILE) is %d; raise it (ulimit -Hn, systemd LimitNOFILE=, docker --ulimit nofile=) to give them more",
		hard, want, hard)
}

// underLauncher makes cmd, built for bwrap or nsenter with its ExtraFiles
// and SysProcAttr, run as the child of the launcher (launcherScript) with
// the resource limits of o, inside the cgroups j opened, once a line comes
// through gate, its stdin (nil: at once, on cmd's stdin); with as, as the
// sandbox's host identity when that needs a change from root:
// the server's fork changes it, no supplementary groups and no
// capabilities (a uid change from root clears them), before the launcher
// starts. Exec's nsenter stays root to join the namespaces and becomes the
// sandbox user inside them itself. cmd.Path stays the program the
// launcher runs, resolved already.
func underLauncher(cmd *exec.Cmd, o Options, j *cgroups.Join, gate *os.File, as *hostuser.Identity) {
	fsize := "unlimited"
	if o.FileSizeLimit > 0 {
		// Rounded up to whole blocks: a limit is never lowered.
		fsize = strconv.FormatInt((o.FileSizeLimit+511)/512, 10)
	}
	g := "-"
	if gate != nil {
		g, cmd.Stdin = "gate", gate
	}
	args := []string{"/bin/sh", "-c", launcherScript, "sh", strconv.Itoa(o.NoFile), fsize, g}
	for _, f := range j.Tasks {
		args = append(args, strconv.Itoa(3+len(cmd.ExtraFiles)))
		cmd.ExtraFiles = append(cmd.ExtraFiles, f)
	}
	args = append(append(args, "--", cmd.Path), cmd.Args[1:]...)
	cmd.Path, cmd.Args = "/bin/sh", args
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	if j.Dir != nil {
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(j.Dir.Fd())
	}
	if as != nil && as.Switch() {
		cmd.SysProcAttr.Credential = as.Credential()
	}
}
