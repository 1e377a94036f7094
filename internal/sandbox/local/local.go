//go:build linux

// Package local runs sandboxes on this machine with bubblewrap (bwrap) and
// cgroups.
//
// Isolation: each sandbox gets new user, mount, pid, network (loopback
// only), IPC, UTS and (where supported) cgroup namespaces, runs as uid/gid
// 1000 inside and as Options.Host on the host (under a root server the
// launcher, and so bwrap, starts as that reserved unprivileged identity,
// never root), with every capability dropped (the bounding set too) and
// no_new_privs, under the seccomp filter of package sandbox/seccomp
// (ptrace, mount, namespaces, keyrings, bpf, io_uring and more refused),
// and sees a read-only host /usr (with /bin, /sbin, /lib* as on the host),
// its own /proc (with /proc/1/mem of bwrap's reaper and the kernel's
// internals masked, /proc/sys read-only) and /dev, a
// size limited /tmp, a generated read-only /etc
// (passwd and group with the worker user, hosts, the host's CA
// certificates, and resolv.conf only when the network is on) and only the
// mounts its Spec names. The root file system is a read-only tmpfs. The
// environment is exactly Spec.Env plus PATH, HOME, USER, TMPDIR and LANG
// defaults. Resource limits: no core files, Options.NoFile open files (at
// most the server's own hard limit),
// Options.FileSizeLimit per file (rlimits set before bwrap starts, hard
// and soft); memory, CPU and pids limits use cgroups v1 or v2 when the
// hierarchy is writable (root, or a delegated subtree); otherwise sandboxes
// run without those and Capabilities says so.
//
// Commands run with Exec join the sandbox's namespaces and cgroups with
// nsenter and get its rlimits, but neither its seccomp filter nor
// no_new_privs: nsenter can set neither. Tasks never use Exec.
//
// Host requirements: Linux with unprivileged user namespaces, bubblewrap
// (apt-get install -y bubblewrap), /bin/sh, and nsenter (util-linux) for
// Exec; on cgroup v2, Linux 5.7 or later (a sandbox starts in its cgroup). Read-write mounts are given to the host identity for the
// sandbox's life and taken back by Destroy (package sandbox/hostuser);
// read-only mount sources and the state dir must be reachable by it.
//
// Sandboxes outlive the server: bwrap runs in its own session with no
// parent-death signal, stdin from /dev/null and output to a file. Everything
// needed to find a sandbox again lives in StateDir/<id>/: state.json (the
// Handle's state), status.jsonl (bwrap's --json-status-fd: the sandbox's
// pid 1 at start, its exit code at the end) and output.log. The generated /etc is the same for every
// sandbox with the same network, so New writes it once per variant, in
// StateDir/_etc/<network>/ (not a sandbox id), and every sandbox binds it.
//
// Lifecycle of one sandbox: Create → running → exited (main process ended,
// by itself or by Stop) → Destroy removes it. Runtime is safe for concurrent
// use; calls on one id are serialised where they change state.
package local

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/cgroups"
	"github.com/corral-dev/corral/internal/sandbox/guestetc"
	"github.com/corral-dev/corral/internal/sandbox/hostproc"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
	"github.com/corral-dev/corral/internal/sandbox/seccomp"
	"github.com/corral-dev/corral/internal/sandbox/statedir"
	"github.com/corral-dev/corral/internal/sandbox/warmpool"
)

var _ sandbox.Runtime = (*Runtime)(nil)

// Name is the runtime's name in Handles and configuration.
const Name = "local"

// stateVersion is the schema version of state, stored in Handle.Version.
const stateVersion = 1

// Options configure a Runtime. Zero fields take the documented defaults.
type Options struct {
	// StateDir is the host directory holding one subdirectory per sandbox.
	// Required. Two Runtimes over one StateDir see the same sandboxes.
	StateDir string
	// DataRoot is the host directory mounts are relative to (Mount.Source).
	// Required, absolute.
	DataRoot string
	// HostRoots are host directories outside DataRoot that sandboxes bind
	// from (workspaces.roots): the launch namespace shows them too.
	HostRoots []string
	// Bwrap is the bubblewrap binary; default "bwrap" from PATH.
	Bwrap string
	// Nsenter is the nsenter binary used by Exec; default "nsenter" from PATH.
	Nsenter string
	// CgroupRoot is the cgroupfs mount point; default /sys/fs/cgroup
	// (v2 if it has cgroup.controllers, else v1 hierarchies under it).
	CgroupRoot string
	// CgroupParent is the parent cgroup of every sandbox's cgroup, relative
	// to the hierarchy root; default "corral".
	CgroupParent string
	// DisableCgroups runs sandboxes without cgroups (and without limits).
	DisableCgroups bool
	// TmpSize bounds the sandbox's /tmp in bytes; default 256 MiB.
	TmpSize int64
	// UID and GID of the sandbox's processes inside it; default 1000.
	UID, GID int
	// Host is the host identity the sandbox's processes run as (what the
	// kernel checks their access against outside the sandbox); default
	// hostuser.Default(): a reserved unprivileged identity when the
	// server runs as root, else the server's own. Never root. Under a
	// root server with the default, each sandbox has one of its own from
	// the range above it (Identities); Host is what they have in common.
	Host hostuser.Identity
	// Identities leases each sandbox its host identity; default one over
	// StateDir/identities. Runtimes of one server share theirs.
	Identities *hostuser.Identities
	// NoFile is the sandbox's limit on open files per process
	// (RLIMIT_NOFILE, soft and hard); default 4096. A limit above the
	// server's own hard limit is lowered to it (see fitNoFile), and
	// Capabilities warns.
	NoFile int
	// FileSizeLimit bounds the size in bytes of any one file a sandbox's
	// process writes (RLIMIT_FSIZE, rounded up to 512 bytes), including
	// the sandbox's output.log; a write past it fails and the writer gets
	// SIGXFSZ. 0: no limit.
	FileSizeLimit int64

	// hostNamespace starts every launcher from the server's own mount
	// namespace, without a launch namespace (launchNS); for benchmarks.
	hostNamespace bool
	// foreWarm starts warm sandboxes at the default CPU weight, not in
	// the background; for benchmarks.
	foreWarm bool

	// Crash, when set, is called at each of sandbox.CrashPoints a task's
	// Create passes here (a warm claim's, a cold start's); the fault tests
	// have the server die there. Nil in production.
	Crash func(point string)
}

func (o *Options) setDefaults() {
	if o.Bwrap == "" {
		o.Bwrap = "bwrap"
	}
	if o.Nsenter == "" {
		o.Nsenter = "nsenter"
	}
	if o.CgroupRoot == "" {
		o.CgroupRoot = "/sys/fs/cgroup"
	}
	if o.CgroupParent == "" {
		o.CgroupParent = "corral"
	}
	if o.TmpSize == 0 {
		o.TmpSize = 256 << 20
	}
	if o.UID == 0 {
		o.UID = 1000
	}
	if o.GID == 0 {
		o.GID = 1000
	}
	if o.NoFile == 0 {
		o.NoFile = 4096
	}
	if o.Host == (hostuser.Identity{}) {
		o.Host = hostuser.Default()
	}
	if o.Identities == nil {
		o.Identities = hostuser.NewIdentities(o.Host, filepath.Join(o.StateDir, "identities"))
	}
}

// Runtime is the local bubblewrap runtime. Create it with New.
type Runtime struct {
	opts   Options
	log    *slog.Logger
	cg     *cgroups.Hierarchy // nil: no cgroups, no limits
	cgWarn string
	// noFileWarn says why sandboxes get fewer open files than
	// Options.NoFile ("" if they do not).
	noFileWarn string

	caps sandbox.Probed

	// filter is the encoded seccomp filter every sandbox runs under;
	// filterErr says why there is none (an unsupported architecture),
	// and then no sandbox starts.
	filter    []byte
	filterErr error

	// launch is the namespace launchers start in (nil: the server's own),
	// and launchWarn why there is none when there should be.
	launch     *launchNS
	launchWarn string

	// Host keeps the runtime's warm sandboxes and hands them to tasks:
	// its KeepWarm and WarmStats are the runtime's (sandbox.Warmer).
	*warmpool.Host[state]

	// Sandboxes is StateDir (state.json per sandbox, the per-id locks
	// that serialise Create and Destroy, the sandboxes this instance has
	// seen) and the lifecycle methods shared with the gvisor runtime.
	*statedir.Sandboxes[state]
}

// state is Handle.State, version 1, also kept in StateDir/<id>/state.json
// (there without ChildPID and PIDNS, which loadState reads from
// status.jsonl). Launch.PID is bwrap's parent, the launcher.
type state struct {
	statedir.Launch
	ChildPID int    `json:"child_pid"` // the sandbox's pid 1, as a host pid
	PIDNS    uint64 `json:"pid_ns"`    // inode of the sandbox's pid namespace
}

// New returns a Runtime keeping its state in opts.StateDir. It creates the
// directory and the parent cgroup; if cgroups are not writable it runs
// sandboxes without limits and logs one warning.
func New(opts Options, log *slog.Logger) (*Runtime, error) {
	opts.setDefaults()
	if !filepath.IsAbs(opts.DataRoot) {
		return nil, fmt.Errorf("local runtime data root %q: must be an absolute path: %w", opts.DataRoot, errdefs.ErrInvalidArgument)
	}
	if opts.StateDir == "" || !filepath.IsAbs(opts.StateDir) {
		return nil, fmt.Errorf("local runtime state dir %q: must be an absolute path: %w", opts.StateDir, errdefs.ErrInvalidArgument)
	}
	if err := checkHost(opts.Host); err != nil {
		return nil, err
	}
	var noFileWarn string
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil {
		opts.NoFile, noFileWarn = fitNoFile(opts.NoFile, rl.Max)
	}
	// bwrap runs as the sandbox identity and binds the generated /etc from
	// here by path: the identity may pass through, not list.
	if err := os.MkdirAll(opts.StateDir, 0o711); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	if err := os.Chmod(opts.StateDir, 0o711); err != nil {
		return nil, fmt.Errorf("open state dir to the sandbox identity: %w", err)
	}
	// Written at every start, so a new version's content replaces an
	// older one's; sandboxes running meanwhile see each file replaced
	// whole.
	for _, n := range []sandbox.Network{sandbox.NetworkNone, sandbox.NetworkEgress} {
		if _, err := guestetc.Write(etcDir(opts.StateDir, n), guestetc.Options{UID: opts.UID, GID: opts.GID, ResolvConf: n == sandbox.NetworkEgress}); err != nil {
			return nil, fmt.Errorf("write the sandboxes' /etc: %w", err)
		}
	}
	r := &Runtime{
		opts:       opts,
		noFileWarn: noFileWarn,
		log:        log.With(logkey.Runtime, Name),
	}
	if prog, err := seccomp.Program(); err != nil {
		r.filterErr = err
	} else {
		r.filter = seccomp.Marshal(prog)
	}
	if opts.DisableCgroups {
		r.cgWarn = "cgroups disabled by configuration: memory, CPU and pids limits are not enforced"
	} else {
		cg, err := cgroups.Detect(opts.CgroupRoot, opts.CgroupParent)
		if err == nil {
			err = cg.Prepare()
		}
		if err != nil {
			r.cgWarn = fmt.Sprintf("cgroups not usable (%v): memory, CPU and pids limits are not enforced", err)
		} else {
			r.cg = cg
		}
	}
	if r.cgWarn != "" {
		r.log.Warn("sandbox limits disabled", "reason", r.cgWarn)
	}
	if !opts.hostNamespace {
		bwrap, _ := exec.LookPath(opts.Bwrap)
		var err error
		if r.launch, err = newLaunchNS(launchRoots(opts, bwrap)); err != nil {
			r.launchWarn = fmt.Sprintf("no launch namespace (%v): each sandbox's start reads the host's whole mount table, once per bind", err)
			r.log.Warn("sandboxes start from the server's mount namespace", logkey.Error, err)
		}
	}
	r.Sandboxes = statedir.NewSandboxes(Name, stateVersion, opts.StateDir, "", r.cg, opts.Identities, r.log, statedir.Ops[state]{
		Load:       loadState,
		ExitStatus: r.exitStatus,
		Creating:   func(e *statedir.Entry[state]) bool { return e.St.ChildPID == 0 },
		Term:       r.term,
		Kill:       r.kill,
		Leftovers:  r.leftovers,
	})
	// Never reattached: a new server starts its own, under a tag of its
	// own (warmpool.Prefix), and destroys those of runtimes gone.
	var err error
	if r.Host, err = r.newWarm(); err != nil {
		return nil, err
	}
	return r, nil
}

// etcDir is the generated /etc of the sandboxes with network n, in
// stateDir: resolv.conf is there only with a network. A name no sandbox id
// can take.
func etcDir(stateDir string, n sandbox.Network) string {
	if n != sandbox.NetworkEgress {
		n = sandbox.NetworkNone
	}
	return filepath.Join(stateDir, "_etc", string(n))
}

// checkHost refuses a host identity sandboxes cannot or must not run as.
func checkHost(id hostuser.Identity) error {
	if err := id.Validate(""); err != nil {
		return fmt.Errorf("local runtime: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	if os.Geteuid() != 0 && id.UID != os.Geteuid() {
		return fmt.Errorf("local runtime: sandbox host identity %s: a server not running as root runs sandboxes as its own uid %d: %w",
			id, os.Geteuid(), errdefs.ErrInvalidArgument)
	}
	return nil
}

// Capabilities probes bwrap once: its version and a trivial sandbox run,
// which fails where user namespaces are disabled.
func (r *Runtime) Capabilities(ctx context.Context) (sandbox.Capabilities, error) {
	return r.caps.Get(ctx, r.probe), nil
}

func (r *Runtime) probe(ctx context.Context) sandbox.Capabilities {
	c := sandbox.Capabilities{Network: true}
	for _, w := range []string{r.cgWarn, r.noFileWarn, r.launchWarn} {
		if w != "" {
			c.Warnings = append(c.Warnings, w)
		}
	}
	if r.cg != nil {
		if n := len(r.cg.Leftovers(time.Minute)); n > 0 {
			c.Warnings = append(c.Warnings, fmt.Sprintf("%d empty sandbox cgroups are left (a destroy could not remove them, or a Corral before 2026-11-27 leaked them when a start failed); many of them slow every sandbox's start; with the server stopped, remove them: rmdir %s",
				n, strings.Join(r.cg.Dirs("*"), " ")))
		}
	}
	path, err := exec.LookPath(r.opts.Bwrap)
	if err != nil {
		c.Reason = "bubblewrap not found (install: apt-get install -y bubblewrap)"
		return c
	}
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		c.Reason = fmt.Sprintf("run %s --version: %v (install: apt-get install -y bubblewrap)", path, err)
		return c
	}
	c.Version = strings.TrimSpace(string(out))
	if r.filterErr != nil {
		c.Reason = r.filterErr.Error()
		return c
	}
	// The probe runs with the same hardening as a sandbox, so a kernel
	// without seccomp or a bwrap without --cap-drop shows here.
	args := []string{"--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
		"--uid", "1000", "--gid", "1000"}
	args = append(args, hardeningArgs()...)
	args = append(args, rootfsArgs()...)
	args = append(args, "--proc", "/proc", "--dev", "/dev", "--", "/usr/bin/true")
	probe := exec.CommandContext(ctx, path, args...)
	if r.opts.Host.Switch() {
		if err := r.opts.Host.Reach(r.opts.StateDir, 0o1); err != nil {
			c.Reason = fmt.Sprintf("the runtime's state directory is closed to the sandbox identity: %v", err)
			return c
		}
		probe.SysProcAttr = &syscall.SysProcAttr{Credential: r.opts.Host.Credential()}
	}
	filter, err := openFilter(r.filter)
	if err != nil {
		c.Reason = err.Error()
		return c
	}
	defer filter.Close()
	// ExtraFiles[i] is fd 3+i; fd 3 is unused here.
	probe.ExtraFiles = []*os.File{nil, filter}
	var probeOut bytes.Buffer
	probe.Stdout, probe.Stderr = &probeOut, &probeOut
	err = r.startLauncher(probe, append(bindSources(args), probe.Path))
	if err == nil {
		err = probe.Wait()
	}
	if err != nil {
		c.Reason = fmt.Sprintf("bubblewrap cannot create namespaces (%v: %s); enable user namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces>0)",
			err, strings.TrimSpace(probeOut.String()))
		return c
	}
	c.Available = true
	c.Limits = r.cg != nil
	if _, err := exec.LookPath(r.opts.Nsenter); err == nil {
		c.Exec = true
	} else {
		c.Warnings = append(c.Warnings, "nsenter not found: Exec unavailable (install: apt-get install -y util-linux)")
	}
	return c
}

// crash calls Options.Crash at point, if set.
func (r *Runtime) crash(point string) {
	if r.opts.Crash != nil {
		r.opts.Crash(point)
	}
}

// Recover reattaches to the sandbox h names (statedir.Sandboxes.Recover),
// once its start is decided: a launcher at its gate, or bwrap not yet
// past making the sandbox's namespaces, or a claimed warm sandbox whose
// worker has not acknowledged its start, is waited for until it runs its
// command or ends without it. The server that would have let it go is
// gone, so that takes moments: the launcher's gate and the worker's
// start pipe closed with it. One still undecided after statedir.DecideWithin (a
// host too busy to schedule it) is killed, so nothing of its task runs
// after all, and its end says so (ExitStatus.NotStarted).
func (r *Runtime) Recover(ctx context.Context, h *sandbox.Handle) error {
	return r.RecoverDecided(ctx, h, undecided)
}

// undecided reports whether the sandbox e may still get its command or
// end without it: bwrap has not reported the sandbox's pid 1 (its main
// process forks only after), or a claimed warm sandbox's worker has not
// acknowledged its start.
func undecided(e *statedir.Entry[state]) bool {
	if s, _ := readStatus(e.Dir); s.ChildPID == 0 {
		return true
	}
	return e.St.Warm != "" && !warmpool.Acked(e.Dir)
}

// loadState completes the state of a sandbox found on disk with the
// sandbox's pid 1, which bwrap reports in status.jsonl: state.json is
// written before bwrap has started it (and after a server that died during
// Create, there is no other record of it).
func loadState(dir string, st state) state {
	if st.ChildPID == 0 {
		if info, ok := readStatus(dir); ok && info.ChildPID > 0 {
			st.ChildPID, st.PIDNS = info.ChildPID, info.PIDNamespace
		}
	}
	return st
}

// Create starts a sandbox for spec and returns once its pid 1 runs (a few
// milliseconds), or hands spec to a warm sandbox of its shape (see
// KeepWarm). It is idempotent on spec.ID.
func (r *Runtime) Create(ctx context.Context, spec sandbox.Spec) (*sandbox.Handle, error) {
	return r.create(ctx, spec, nil)
}

// create is Create; a warm sandbox's main process also gets start, the
// read end of the pipe its task will come through, as warmstart.FD.
func (r *Runtime) create(ctx context.Context, spec sandbox.Spec, start *os.File) (*sandbox.Handle, error) {
	if err := r.opts.Host.ValidateSpec(spec, r.opts.DataRoot); err != nil {
		return nil, fmt.Errorf("validate sandbox spec: %w", err)
	}
	// A warm sandbox's own spec claims none.
	return r.Host.Create(ctx, spec, start == nil, func(spec sandbox.Spec) (*sandbox.Handle, error) {
		return r.createCold(ctx, spec, start)
	})
}

// createCold starts spec's sandbox cold (warmpool.Host.Create's cold):
// its mounts resolved, its id locked, no sandbox of its id there.
func (r *Runtime) createCold(ctx context.Context, spec sandbox.Spec, start *os.File) (*sandbox.Handle, error) {
	caps, _ := r.Capabilities(ctx)
	if !caps.Available {
		return nil, fmt.Errorf("create sandbox %s: %s: %w", spec.ID, caps.Reason, errdefs.ErrFailedPrecondition)
	}
	dir := r.Dir.Path(spec.ID)
	// A directory without state.json is a Create that crashed before it
	// started anything; start over.
	if err := r.Dir.RemoveLeftovers(nil, spec.ID, false); err != nil {
		return nil, fmt.Errorf("clean state dir: %w", err)
	}
	// The server's alone: bwrap gets what it needs of it as open files.
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	e, err := r.start(ctx, spec, dir, start)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}
	r.Dir.Set(spec.ID, e)
	r.log.Info("sandbox started", logkey.SandboxID, spec.ID, "pid", e.St.ChildPID, "uid", e.St.Identity.UID)
	return r.Handle(e.St), nil
}

// start launches bwrap for spec in dir and waits for the sandbox's pid 1;
// start, if not nil, is passed on to the main process as warmstart.FD.
func (r *Runtime) start(ctx context.Context, spec sandbox.Spec, dir string, start *os.File) (_ *statedir.Entry[state], err error) {
	etc := etcDir(r.opts.StateDir, spec.Network)
	etcBinds, err := guestetc.MountPoints(etc)
	if err != nil {
		return nil, err
	}
	st := state{Launch: statedir.Launch{ID: spec.ID, Labels: maps.Clone(spec.Labels), CreatedAt: time.Now().UTC()}}
	if st.Identity, err = r.opts.Identities.Take(spec.ID); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			r.opts.Identities.Release(spec.ID)
		}
	}()
	if r.cg != nil {
		if st.Cgroups, err = r.cg.Create(spec.ID, spec.Limits); err != nil {
			return nil, fmt.Errorf("create cgroups: %v: %w", err, errdefs.ErrUnavailable)
		}
		defer func() {
			if err != nil {
				// After the launcher's group is dead: a sandbox pid 1
				// that outlived it is killed here.
				cgroups.KillAndRemove(st.Cgroups)
			}
		}()
		if start != nil && !r.opts.foreWarm { // a warm sandbox: its claim brings it to the fore
			if err = r.cg.Background(st.Cgroups, true); err != nil {
				return nil, fmt.Errorf("start a warm sandbox in the background: %w", err)
			}
		}
	}
	status, err := os.OpenFile(filepath.Join(dir, "status.jsonl"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create status file: %w", err)
	}
	defer status.Close()
	out, err := os.OpenFile(filepath.Join(dir, "output.log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create output file: %w", err)
	}
	defer out.Close()
	// The launcher waits at its gate until the state below is written: a
	// server that dies before leaves a launcher that exits, bwrap never
	// run, and never a sandbox no state names.
	gate, letGo, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("create launcher gate: %w", err)
	}
	defer gate.Close()
	defer letGo.Close()
	var ack *os.File
	if start != nil {
		// A warm sandbox's worker says here that it has its task's start
		// (warmstart.AckFD), before it runs anything of it.
		if ack, err = warmpool.OpenAck(dir); err != nil {
			return nil, err
		}
		defer ack.Close()
	}

	// A workspace under a root is pinned; a warm sandbox's slots, its
	// only host directories, are the server's own and need no pin (and
	// its state dir takes a task's name when claimed).
	if start == nil {
		if spec, err = hostuser.Pin(spec, r.Dir.Pins(spec.ID), st.Identity); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				hostuser.Unpin(r.Dir.Pins(spec.ID))
			}
		}()
	}
	st.Owned, err = hostuser.Give(hostuser.WritableDirs(spec.Mounts), st.Identity)
	defer func() {
		if err != nil {
			hostuser.Reclaim(st.Owned)
		}
	}()
	if err != nil {
		return nil, err
	}
	join, err := cgroups.OpenJoin(st.Cgroups)
	if err != nil {
		return nil, err
	}
	defer join.Close()
	filter, err := openFilter(r.filter)
	if err != nil {
		return nil, err
	}
	defer filter.Close()
	// Not CommandContext: the sandbox must outlive ctx and this process.
	args := bwrapArgs(spec, r.opts, etc, etcBinds)
	cmd := exec.Command(r.opts.Bwrap, args...)
	// bwrap's path, before the launcher takes its place.
	paths := append(bindSources(args), cmd.Path)
	cmd.Env = sandbox.DefaultEnv(spec.Env) // the launcher and bwrap pass it on as it is
	cmd.Stdout, cmd.Stderr = out, out
	cmd.ExtraFiles = []*os.File{status, filter} // fd 3: --json-status-fd 3; fd 4: --seccomp 4
	if start != nil {
		// fd 5: warmstart.FD, fd 6: warmstart.AckFD, through bwrap to the
		// main process
		cmd.ExtraFiles = append(cmd.ExtraFiles, start, ack)
	}
	// Own session, no Pdeathsig: a server killed with SIGKILL leaves the
	// sandbox running and a new server recovers it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	underLauncher(cmd, r.opts, join, gate, &st.Identity)
	if err := r.startLauncher(cmd, append(paths, cmd.Path)); err != nil {
		if join.Dir != nil && errors.Is(err, syscall.ENOSYS) {
			return nil, fmt.Errorf("start bwrap in its cgroup (clone3 with CLONE_INTO_CGROUP, Linux 5.7 or later on cgroup v2): %w", err)
		}
		return nil, fmt.Errorf("start bwrap: %w", err)
	}
	st.PID = cmd.Process.Pid
	// Our unreaped child cannot be replaced by another process with the
	// same pid, so this start time is the launcher's.
	st.PIDStart, _ = hostproc.StartTime(st.PID)
	e := statedir.Started[state](dir, cmd)
	defer func() {
		if err != nil {
			killLauncher(st.PID)
			<-e.Done()
		}
	}()
	if start == nil {
		r.crash(sandbox.CrashLaunched)
	}
	if err := r.Dir.Write(spec.ID, st); err != nil {
		return nil, err
	}
	if start == nil {
		r.crash(sandbox.CrashGated)
	}
	if _, err := letGo.Write([]byte("\n")); err != nil {
		return nil, fmt.Errorf("let the launcher go: %w", err)
	}
	letGo.Close()

	// bwrap writes the child pid to status.jsonl once the namespaces exist,
	// before it has set up the mounts; its pid 1 forks the main process
	// only after that, and the main process installs the seccomp filter,
	// tells bwrap its set-up is done and executes the command. Waiting for
	// that execve means Exec never sees a half built sandbox, and a Stop
	// right after Create finds the main process past the point from which
	// bwrap reports its exit code (killed before it, the sandbox ended with
	// no exit status: TestStopRightAfterCreate, and TestRecoverFromStatus in
	// CI under load). All of it takes 5 to 15 ms. Nothing signals it, so it
	// is polled, every millisecond for the first 20 ms: a task's worker
	// runs from that moment, and its completion waits for the task_started
	// recorded after this returns, so any lateness here is the task's. (A
	// 1 -> 10 ms back-off cost 3 to 8 ms per task once the worker was that
	// fast.) Past 20 ms the machine is busy, and every poll takes CPU from
	// the sandboxes being started: from then on the poll waits a twentieth
	// of the time waited so far (at most 10 ms), which adds at most 5 % to
	// the wait. A poll after the first few reads one small /proc file.
	began := time.Now()
	poll := time.NewTimer(time.Millisecond)
	defer poll.Stop()
	var watch *hostproc.ExecWatch
	for ready := false; !ready; {
		if st.ChildPID == 0 {
			if info, ok := readStatus(dir); ok && info.ChildPID > 0 {
				st.ChildPID, st.PIDNS = info.ChildPID, info.PIDNamespace
				watch = hostproc.WatchExec(st.ChildPID)
			}
		}
		ready = watch != nil && watch.Done()
		if ready {
			break
		}
		select {
		case <-e.Done():
			if info, ok := readStatus(dir); ok && info.ChildPID > 0 {
				// The main process ran and exited already.
				st.ChildPID, st.PIDNS = info.ChildPID, info.PIDNamespace
				ready = true
				break
			}
			ps, _ := e.Reaped()
			return nil, fmt.Errorf("bwrap exited (%v): %s", ps, statedir.Tail(filepath.Join(dir, "output.log")))
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-poll.C:
			poll.Reset(min(max(time.Since(began)/20, time.Millisecond), 10*time.Millisecond))
		}
	}
	// Not written to state.json: loadState reads the pid 1 back from
	// status.jsonl, which bwrap wrote it to, and a second write would be a
	// second file made and renamed per sandbox.
	e.St = st
	return e, nil
}

// startLauncher starts cmd, a launcher binding paths from the host, in the
// launch namespace if every path is the same file there, else from the
// server's own.
func (r *Runtime) startLauncher(cmd *exec.Cmd, paths []string) error {
	if r.launch != nil {
		if started, err := r.launch.start(cmd, paths); started {
			return err
		}
		r.log.Debug("launcher started from the server's mount namespace: a path it binds differs in the launch namespace, or that is closed", "paths", paths)
	}
	return cmd.Start()
}

// Close ends the launch namespace. Sandboxes keep running; launchers
// started after Close start from the server's own namespace.
func (r *Runtime) Close() error {
	if r.launch != nil {
		r.launch.close()
	}
	return r.Host.Close()
}

// openFilter returns the encoded seccomp filter in a sealed memory file
// (memfd), open for reading from the start: bwrap reads its --seccomp
// descriptor to the end, so every bwrap needs a fresh one. In memory, not
// in the state dir: one file fewer made and deleted on disk per sandbox.
// Sealed, so that nothing holding the descriptor can change it.
func openFilter(filter []byte) (*os.File, error) {
	fd, err := unix.MemfdCreate("corral-seccomp", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("create seccomp filter file: %w", err)
	}
	f := os.NewFile(uintptr(fd), "corral-seccomp")
	if _, err := f.Write(filter); err != nil {
		f.Close()
		return nil, fmt.Errorf("write seccomp filter: %w", err)
	}
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE); err != nil {
		f.Close()
		return nil, fmt.Errorf("seal seccomp filter: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("rewind seccomp filter: %w", err)
	}
	return f, nil
}

// bwrapStatus is what bwrap reports on --json-status-fd.
type bwrapStatus struct {
	ChildPID     int
	PIDNamespace uint64
	ExitCode     int
	Exited       bool
}

func readStatus(dir string) (bwrapStatus, bool) {
	var s bwrapStatus
	f, err := os.Open(filepath.Join(dir, "status.jsonl"))
	if err != nil {
		return s, false
	}
	defer f.Close()
	found := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// bwrap writes one JSON object per line; a line may be partial
		// while it is being written, so errors are skipped.
		var m struct {
			ChildPID *int    `json:"child-pid"`
			PIDNS    *uint64 `json:"pid-namespace"`
			ExitCode *int    `json:"exit-code"`
		}
		if json.Unmarshal(bytes.TrimSpace(sc.Bytes()), &m) != nil {
			continue
		}
		found = true
		if m.ChildPID != nil {
			s.ChildPID = *m.ChildPID
		}
		if m.PIDNS != nil {
			s.PIDNamespace = *m.PIDNS
		}
		if m.ExitCode != nil {
			s.ExitCode, s.Exited = *m.ExitCode, true
		}
	}
	return s, found
}

// exitStatus is how the exited sandbox ended: bwrap's reported exit code of
// the sandbox's main process, else bwrap's own wait status, else -1.
func (r *Runtime) exitStatus(e *statedir.Entry[state]) sandbox.ExitStatus {
	es := sandbox.ExitStatus{Code: -1}
	ps, exitAt := e.Reaped()
	if s, _ := readStatus(e.Dir); s.Exited {
		es.Code = s.ExitCode
		if fi, err := os.Stat(filepath.Join(e.Dir, "status.jsonl")); err == nil {
			es.ExitedAt = fi.ModTime().UTC()
		}
	} else if ps != nil {
		es.Code = ps.ExitCode()
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			es.Code = 128 + int(ws.Signal())
			es.Message = "bwrap killed by signal " + ws.Signal().String()
		}
	} else {
		es.Message = "exit status unknown"
	}
	if es.ExitedAt.IsZero() {
		es.ExitedAt = exitAt
	}
	if oomKilled(e.St.Cgroups) {
		es.OOMKilled = true
		es.Message = "OOMKilled"
	} else {
		statedir.Explain(&es, e.Dir)
	}
	// Create returns once the main process runs, and a claim once the
	// start is sent: either is so only after a restart, or for a worker
	// that could not acknowledge its start (and so ran none of it).
	switch s, _ := readStatus(e.Dir); {
	case s.ChildPID == 0:
		es.NotStarted, es.Message = true, "its launcher never ran it: the server died before letting it go"
	case e.St.Warm != "" && !warmpool.Acked(e.Dir):
		es.NotStarted, es.Message = true, "its worker never had its task's start: the server died between the claim and the start"
	}
	return es
}

// oomKilled reports whether the kernel's OOM killer killed a process in the
// sandbox's memory cgroup; on kernels without an oom_kill counter (before
// 4.13) a v1 memory.failcnt above zero counts as one.
func oomKilled(dirs []string) bool {
	n, ok := cgroups.OOMKills(dirs)
	if !ok {
		n = cgroups.Failcnt(dirs)
	}
	return n > 0
}

// killLauncher SIGKILLs the launcher pid and its process group (it is a
// session leader): the shell, and bwrap, its child. The shell alone is
// not enough: bwrap asks to die with its parent (--die-with-parent) only
// once it runs, so a launcher killed before that left bwrap setting up
// the sandbox, unsupervised, its cgroups busy for good.
func killLauncher(pid int) {
	syscall.Kill(-pid, syscall.SIGKILL)
}

// pidNS holds the sandbox's pid namespace while its pid 1 lives (the
// kernel lets pid 1 go last); nil once pid 1 is gone, or before bwrap got
// as far as it.
func pidNS(e *statedir.Entry[state]) *hostproc.PidNS {
	return hostproc.OpenPidNS(e.St.ChildPID, e.St.PIDNS)
}

// term sends SIGTERM to every process in the sandbox's pid namespace (no
// process can leave it). bwrap's pid 1 has no SIGTERM handler, so the
// kernel drops the signal for it; the main process and its children get it.
func (r *Runtime) term(ctx context.Context, e *statedir.Entry[state]) {
	if ns := pidNS(e); ns != nil {
		ns.Signal(syscall.SIGTERM)
		ns.Close()
	}
}

// kill SIGKILLs every process in the sandbox's pid namespace, its pid 1
// first (whose death makes the kernel kill every other; bwrap then
// reports exit code 137 and exits), waits for bwrap, then for what is left
// (killLeft).
func (r *Runtime) kill(ctx context.Context, e *statedir.Entry[state]) error {
	ns := pidNS(e)
	defer ns.Close()
	if ns != nil {
		ns.Signal(syscall.SIGKILL)
	} else if e.St.ChildPID == 0 && e.Running() {
		// bwrap never got as far as pid 1.
		killLauncher(e.St.PID)
	}
	if err := e.WaitExit(ctx); err != nil {
		return err
	}
	return killLeft(ctx, ns)
}

// leftovers ends what is left of a sandbox whose launcher has exited
// (statedir.Ops.Leftovers). bwrap exits as soon as its pid 1 tells it the
// main process's exit code; only then does --die-with-parent have the
// kernel kill pid 1 and, once pid 1 runs again to die, every other process
// in its namespace. Until then a child that outlives the main process (one
// that ignores the SIGTERM of a Stop) keeps running: after a graceful stop
// on a busy host, for as long as the scheduler keeps pid 1 waiting
// (TestStopLeavesNoProcess; the conformance suite's StopProcessTree saw
// one append to its file after Stop and Wait had returned).
func (r *Runtime) leftovers(ctx context.Context, e *statedir.Entry[state]) error {
	ns := pidNS(e)
	defer ns.Close()
	return killLeft(ctx, ns)
}

// killLeft SIGKILLs every process in ns (nil: none) until none is left
// that runs anything of its own. SIGKILL is sent, not done: a process in a
// system call (a write) finishes it before it dies, also after bwrap has
// gone.
func killLeft(ctx context.Context, ns *hostproc.PidNS) error {
	for ns != nil && ns.Signal(syscall.SIGKILL) > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}
