//go:build linux

// Package gvisor runs sandboxes under gVisor's runsc: every system call of
// the sandboxed processes is served by gVisor's user-space kernel (the
// sentry), not the host's, and files reach the sandbox through a separate
// gofer process.
//
// Isolation: the same view as the local runtime. The root file system is a
// read-only directory this package builds per sandbox (an OCI bundle in
// StateDir/<id>/bundle): the host's /usr read-only with /bin, /sbin, /lib*
// as on the host, a generated /etc (passwd and group with the user worker,
// uid/gid 1000, hosts, hostname, nsswitch.conf; the host's CA certificates,
// ld.so.cache and time zone bound read-only), gVisor's own /proc and /dev, a
// private tmpfs /tmp, and the Spec's mounts as bind mounts. The process runs
// as 1000:1000 with no capabilities and no_new_privs, hostname corral, in
// the Spec's working directory with the Spec's environment and nothing of
// the server's.
//
// runsc flags, chosen for hosts like CI's (a VM or container without
// /dev/kvm, Debian's runsc 20221219) and kept in one place (globalArgs):
//
//   - --platform: Options.Platform; by default systrap where the runsc
//     has it (gVisor's default since 2023), else ptrace, the slowest
//     platform (about 0.2 s per sandbox start and costly system calls),
//     which is all Debian 12's runsc has besides KVM. Both work nested;
//     KVM needs /dev/kvm and is used only when asked for.
//   - --network=none: the sandbox's network stack has loopback only. Egress
//     (Spec.Network "egress") also gets loopback only: the worker reaches
//     the egress proxy and the completion webhook through unix sockets in a
//     bind-mounted directory, never through a network device.
//   - --host-uds=open: lets sandboxed processes connect to host unix sockets
//     in bind mounts (the webhook and egress sockets under /run/corral). It
//     does not let them create host sockets. runsc warns that the gofer's
//     seccomp filter is then a little less strict (it may call connect).
//   - --oci-seccomp: the bundle's linux.seccomp, the local runtime's
//     seccomp policy (package seccomp) written as an OCI profile, is
//     enforced inside the sandbox: gVisor's own kernel then refuses ptrace,
//     mount, namespaces, keyctl, bpf and the rest the way the host's does
//     for local sandboxes (see seccompProfile for what this runsc can
//     express). The filter applies to the sandbox's first process and
//     what it starts, not to commands started with Exec: runsc exec does
//     not apply the bundle's profile, so inside gVisor they may ptrace
//     their children and create user namespaces.
//   - --root=StateDir/runsc: runsc's own state, apart from any other runsc.
//   - cgroups: each sandbox gets cgroups that this package creates before
//     runsc starts, with the memory, CPU and pids limits written in; runsc
//     joins the sandbox and gofer to a cgroup that exists and leaves its
//     settings and its removal to its creator, so the OOM counter survives
//     the sandbox for Wait to read. --ignore-cgroups is passed only when
//     the cgroup hierarchy is not writable (no root, no delegation); then
//     limits are not enforced and Capabilities says so.
//   - rootful: runsc runs as root (it drops privileges itself: the sentry
//     runs as nobody in its own namespaces, with a seccomp filter).
//
// Limits. The sentry and the gofer are charged to the sandbox's cgroups, so
// Limits.MemoryBytes (plus Options.MemoryOverhead, default none) bounds the
// whole sandbox, gVisor's kernel included; a memory bomb gets the sentry
// OOM-killed, which ends the whole sandbox, and Wait reports OOMKilled from
// the cgroup's oom_kill counter. (System calls are slow under ptrace: a
// shell filling 32 MiB through a pipe takes about 15 s to be killed.) The pids limit
// is enforced inside the sandbox as RLIMIT_NPROC of the sandbox user (the
// sentry counts that user's tasks; fork fails with EAGAIN), because with the
// ptrace platform every sandboxed process costs the host about ten threads,
// and a host pids cgroup that runs out makes the sentry panic; the host
// pids cgroup is set to a generous backstop (pidsBackstop). CPU is a CFS
// quota on the cgroup.
//
// Secrets: Spec.Env may hold API keys. They are written only into the
// bundle's config.json (mode 0600, in the 0700 state dir, which runsc must
// read) and are never logged; Destroy removes them with the state dir.
// Exec's environment goes through a process.json of the same mode that is
// removed when the command ends.
//
// Host requirements: Linux, root, runsc (apt-get install -y runsc), /bin/sh.
//
// Sandboxes outlive the server: a /bin/sh launcher in its own session runs
// `runsc run` as its child and writes runsc's exit status (the main
// process's exit code, 128+n for signal n) to StateDir/<id>/exit when it
// ends; neither has the server as a parent that matters, so a server
// killed with SIGKILL leaves them running and a new one finds them in
// StateDir (state.json: the launcher's pid and start time, the cgroups).
// A restore's launcher (`runsc restore`) runs under a child subreaper,
// Options.Subreaper, whose pid is then the one recorded.
// `runsc wait` cannot be used after a restart: once the sandbox has exited
// it no longer knows the exit status.
//
// Lifecycle of one sandbox: Create (bundle, cgroups, launcher; returns once
// runsc reports the container running) → running → exited (the main
// process ended, by itself or by Stop) → Destroy removes it. Runtime is safe
// for concurrent use; Create and Destroy on one id are serialised.
package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/cgroups"
	"github.com/corral-dev/corral/internal/sandbox/hostproc"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
	"github.com/corral-dev/corral/internal/sandbox/statedir"
	"github.com/corral-dev/corral/internal/sandbox/warmpool"
)

var _ sandbox.Runtime = (*Runtime)(nil)

// Name is the runtime's name in Handles and configuration.
const Name = "gvisor"

// stateVersion is the schema version of state, stored in Handle.Version.
const stateVersion = 1

// Options configure a Runtime. Zero fields take the documented defaults.
type Options struct {
	// StateDir is the host directory holding one subdirectory per sandbox
	// and runsc's root (StateDir/runsc). Required, absolute, and short
	// enough for runsc's paths. Two Runtimes over one StateDir see the
	// same sandboxes.
	StateDir string
	// DataRoot is the host directory mounts are relative to (Mount.Source).
	// Required, absolute.
	DataRoot string
	// Runsc is the runsc binary; default "runsc" from PATH. New resolves
	// it to an absolute path: the launcher runs it with a PATH of its own.
	Runsc string
	// Platform is runsc's --platform (ptrace, systrap or kvm); default
	// DefaultPlatform(Runsc).
	Platform string
	// CgroupRoot is the cgroupfs mount point; default /sys/fs/cgroup.
	CgroupRoot string
	// CgroupParent is the parent cgroup of every sandbox's cgroup,
	// relative to the hierarchy root; default "corral-gvisor".
	CgroupParent string
	// DisableCgroups runs sandboxes with --ignore-cgroups (no limits but
	// the pids rlimit).
	DisableCgroups bool
	// MemoryOverhead is added to Limits.MemoryBytes for the memory cgroup,
	// which also holds the sentry and the gofer (about 15 MiB at rest, 45
	// MiB with 64 processes); default none: the whole sandbox, gVisor's
	// kernel included, gets Limits.MemoryBytes.
	MemoryOverhead int64
	// TmpSize bounds the sandbox's /tmp in bytes; default 256 MiB.
	TmpSize int64
	// Host is the identity of the sandbox's processes, inside and on the
	// host alike: gVisor checks a file's access against its owner on the
	// host, and its gofer creates files owned by the process's uid, so the
	// two cannot differ. Default hostuser.Default(), a reserved
	// unprivileged identity (never root, never an id a person owns).
	// Under a root server with the default, each sandbox has one of its
	// own from the range above it (Identities).
	Host hostuser.Identity
	// Identities leases each sandbox its host identity; default one over
	// StateDir/identities. Runtimes of one server share theirs.
	Identities *hostuser.Identities
	// Subreaper is the corral-worker executable, absolute: a restore's
	// launcher runs under `Subreaper worker subreaper`, which adopts and
	// reaps the gofer that `runsc restore` leaves an orphan, so that the
	// container's delete after its next checkpoint does not wait for the
	// host's init to reap it (1.5 s a suspend on some hosts:
	// docs/sessions-suspend.md). Empty: none, and those waits.
	Subreaper string
	// Crash, when set, is called at each of sandbox.CrashPoints Create
	// passes here (a cold start's sandbox.CrashLaunched and CrashGated, a
	// warm claim's CrashClaimed, CrashMoved, CrashHandedOver and
	// CrashSent); the fault tests have the server die there. Nil in
	// production.
	Crash func(point string)
}

func (o *Options) setDefaults() {
	if o.Runsc == "" {
		o.Runsc = "runsc"
	}
	if o.CgroupRoot == "" {
		o.CgroupRoot = "/sys/fs/cgroup"
	}
	if o.CgroupParent == "" {
		o.CgroupParent = "corral-gvisor"
	}
	if o.TmpSize == 0 {
		o.TmpSize = 256 << 20
	}
	if o.Host == (hostuser.Identity{}) {
		o.Host = hostuser.Default()
	}
	if o.Identities == nil {
		o.Identities = hostuser.NewIdentities(o.Host, filepath.Join(o.StateDir, "identities"))
	}
}

// Runtime is the gVisor runtime. Create it with New.
type Runtime struct {
	opts   Options
	log    *slog.Logger
	cg     *cgroups.Hierarchy // nil: --ignore-cgroups, no limits
	cgWarn string

	caps sandbox.Probed

	// image are the flags of runsc checkpoint and restore that this runsc
	// offers for a quicker save and restore (ImageFlags).
	image ImageOptions

	// Host keeps the runtime's warm sandboxes and hands them to tasks:
	// its KeepWarm and WarmStats are the runtime's (sandbox.Warmer).
	*warmpool.Host[state]

	// Sandboxes is StateDir (state.json per sandbox, the per-id locks
	// that serialise Create and Destroy, the sandboxes this instance has
	// seen) and the lifecycle methods shared with the local runtime.
	// runsc's own directory, StateDir/runsc, is reserved.
	*statedir.Sandboxes[state]
}

// state is Handle.State, version 1, also kept in StateDir/<id>/state.json.
// Launch.Warm, of a claimed warm sandbox, is the id runsc knows it by.
type state struct {
	statedir.Launch
}

// container is runsc's id of the sandbox.
func (s state) container() string {
	if s.Warm != "" {
		return s.Warm
	}
	return s.ID
}

// New returns a Runtime keeping its state in opts.StateDir. It creates the
// directory and the parent cgroup; if cgroups are not writable, sandboxes
// run with --ignore-cgroups and New logs one warning.
func New(opts Options, log *slog.Logger) (*Runtime, error) {
	opts.setDefaults()
	if !filepath.IsAbs(opts.DataRoot) {
		return nil, fmt.Errorf("gvisor runtime data root %q: must be an absolute path: %w", opts.DataRoot, errdefs.ErrInvalidArgument)
	}
	if opts.StateDir == "" || !filepath.IsAbs(opts.StateDir) {
		return nil, fmt.Errorf("gvisor runtime state dir %q: must be an absolute path: %w", opts.StateDir, errdefs.ErrInvalidArgument)
	}
	if opts.Subreaper != "" {
		if fi, err := os.Stat(opts.Subreaper); !filepath.IsAbs(opts.Subreaper) || err != nil || fi.Mode()&0o111 == 0 || !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("gvisor runtime subreaper %q: must be an absolute path to an executable file: %w", opts.Subreaper, errdefs.ErrInvalidArgument)
		}
	}
	if err := os.MkdirAll(filepath.Join(opts.StateDir, "runsc"), 0o700); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	// A runsc not found stays as given: Capabilities says it is missing.
	if path, err := exec.LookPath(opts.Runsc); err == nil {
		opts.Runsc = path
	}
	switch opts.Platform {
	case "":
		opts.Platform = DefaultPlatform(opts.Runsc)
	case "ptrace", "systrap", "kvm":
	default:
		return nil, fmt.Errorf("gvisor runtime platform %q: must be ptrace, systrap or kvm: %w", opts.Platform, errdefs.ErrInvalidArgument)
	}
	r := &Runtime{
		opts: opts,
		log:  log.With(logkey.Runtime, Name),
	}
	r.image = ImageFlags(opts.Runsc)
	if opts.DisableCgroups {
		r.cgWarn = "cgroups disabled by configuration: memory and CPU limits are not enforced"
	} else {
		cg, err := cgroups.Detect(opts.CgroupRoot, opts.CgroupParent)
		if err == nil {
			err = cg.Prepare()
		}
		if err != nil {
			r.cgWarn = fmt.Sprintf("cgroups not usable (%v): runsc runs with --ignore-cgroups, memory and CPU limits are not enforced", err)
		} else {
			r.cg = cg
		}
	}
	if r.cgWarn != "" {
		r.log.Warn("sandbox limits disabled", "reason", r.cgWarn)
	}
	r.Sandboxes = statedir.NewSandboxes(Name, stateVersion, opts.StateDir, "runsc", r.cg, opts.Identities, r.log, statedir.Ops[state]{
		ExitStatus: r.exitStatus,
		Term:       r.term,
		Kill:       r.kill,
		Release:    r.release,
	})
	// Never reattached: a new server starts its own, under a tag of its
	// own (warmpool.Prefix), and destroys those of runtimes gone.
	var err error
	if r.Host, err = r.newWarm(); err != nil {
		return nil, err
	}
	return r, nil
}

// DefaultPlatform is the platform runsc runs sandboxes with by default:
// systrap where `runsc help platforms` lists it, else ptrace (also when
// runsc cannot be run: Capabilities then says why).
func DefaultPlatform(runsc string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, runsc, "help", "platforms").Output()
	if slices.Contains(strings.Fields(string(out)), "systrap") {
		return "systrap"
	}
	return "ptrace"
}

// ImageOptions are the flags of runsc checkpoint and restore that the
// runtime gives a runsc which has them (the runsc of 2025 that
// scripts/k8s/build.sh builds does; Debian 12's of 2022 has none): the
// image uncompressed, since flate took most of both on memory that does
// not compress (by hand on the runsc of 2025 here, a restore of 512 MiB
// in 0.45 s against 0.9 to 1.4 s compressed), and the restore's memory
// read on in the background once the sandbox runs, which an uncompressed
// image allows (runsc passes the image's files to the sandbox, so that
// removing them after the restore takes nothing from it).
type ImageOptions struct {
	Checkpoint, Restore []string
	// Direct: runsc can write the image's pages with O_DIRECT
	// (--direct), which CheckpointFlags adds where the image's
	// filesystem takes it. Through the page cache, the image's pages are
	// charged to the sandbox's memory cgroup, where the sandbox's own
	// memory already is: near its limit, the sentry's writes wait for
	// reclaim. A checkpoint of 512 MiB in a sandbox limited to 2 GiB took
	// 1.5 to 1.7 s through the page cache and 0.36 to 0.56 s direct here
	// (docs/benchmarks.md).
	Direct bool
}

// ImageFlags asks runsc which of ImageOptions' flags it has.
func ImageFlags(runsc string) ImageOptions {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	help := func(cmd string) []string {
		out, _ := exec.CommandContext(ctx, runsc, "help", cmd).Output()
		return strings.Fields(string(out))
	}
	checkpoint := help("checkpoint")
	if !slices.Contains(checkpoint, "-compression") {
		return ImageOptions{}
	}
	o := ImageOptions{Checkpoint: []string{"--compression=none"}, Direct: slices.Contains(checkpoint, "-direct")}
	if slices.Contains(help("restore"), "-background") {
		o.Restore = []string{"--background"}
	}
	return o
}

// CheckpointFlags are o's flags for a checkpoint into dir: o.Checkpoint,
// and --direct where runsc has it and dir's filesystem opens a file with
// O_DIRECT (tmpfs before Linux 6.6 does not). Asked first, not tried: a
// checkpoint that fails ends the sandbox.
func (o ImageOptions) CheckpointFlags(dir string) []string {
	if !o.Direct {
		return o.Checkpoint
	}
	probe := filepath.Join(dir, ".o_direct")
	f, err := os.OpenFile(probe, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_DIRECT, 0o600)
	if err != nil {
		return o.Checkpoint
	}
	f.Close()
	os.Remove(probe)
	return append(slices.Clip(o.Checkpoint), "--direct")
}

// globalArgs are runsc's flags for every subcommand: runsc keeps no flags
// between calls, and start, kill or exec with other flags than create would
// treat the sandbox differently (without --network=none, runsc start fails).
func (r *Runtime) globalArgs() []string {
	args := []string{
		"--root=" + filepath.Join(r.opts.StateDir, "runsc"),
		"--platform=" + r.opts.Platform,
		"--network=none",
		"--host-uds=open",
		"--oci-seccomp",
	}
	if r.cg == nil {
		args = append(args, "--ignore-cgroups")
	}
	return args
}

// runsc runs one short runsc subcommand and returns its combined output.
func (r *Runtime) runsc(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, r.opts.Runsc, append(r.globalArgs(), args...)...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("runsc %s: %w: %s", args[0], err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// Capabilities finds runsc and runs one trivial sandbox with the flags
// Create uses, once; the result is cached.
func (r *Runtime) Capabilities(ctx context.Context) (sandbox.Capabilities, error) {
	return r.caps.Get(ctx, r.probe), nil
}

func (r *Runtime) probe(ctx context.Context) sandbox.Capabilities {
	c := sandbox.Capabilities{Network: true}
	if r.cgWarn != "" {
		c.Warnings = append(c.Warnings, r.cgWarn)
	}
	path, err := exec.LookPath(r.opts.Runsc)
	if err != nil {
		c.Reason = "runsc not found (install: apt-get install -y runsc)"
		return c
	}
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		c.Reason = fmt.Sprintf("run %s --version: %v (install: apt-get install -y runsc)", path, err)
		return c
	}
	c.Version = "gVisor " + strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0]) + ", platform " + r.opts.Platform
	if os.Geteuid() != 0 {
		c.Reason = "the gvisor runtime needs root (runsc runs rootful)"
		return c
	}
	if err := r.probeRun(ctx); err != nil {
		c.Reason = fmt.Sprintf("runsc cannot run a sandbox here (platform %s): %v", r.opts.Platform, err)
		return c
	}
	c.Available = true
	c.Limits = r.cg != nil
	c.Exec = true
	c.Checkpoint = true
	return c
}

// probeRun runs /usr/bin/true in a throwaway bundle under StateDir (its
// name starts with a dot, so List never sees it) with the global flags.
func (r *Runtime) probeRun(ctx context.Context) error {
	id := fmt.Sprintf("probe-%d-%d", os.Getpid(), time.Now().UnixNano())
	dir := filepath.Join(r.opts.StateDir, "."+id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("create probe dir: %w", err)
	}
	defer os.RemoveAll(dir)
	spec := sandbox.Spec{ID: id, Command: []string{"/usr/bin/true"}}
	if err := writeBundle(filepath.Join(dir, "bundle"), spec, r.opts, ""); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	_, err := r.runsc(ctx, "run", "--bundle", filepath.Join(dir, "bundle"), id)
	if err != nil {
		r.runsc(context.Background(), "delete", "--force", id)
	}
	return err
}

// Create builds the sandbox's bundle and cgroups, starts the launcher and
// returns once runsc reports the container running (about 0.2 to 0.5 s
// with the ptrace platform). It is idempotent on spec.ID.
func (r *Runtime) Create(ctx context.Context, spec sandbox.Spec) (*sandbox.Handle, error) {
	return r.create(ctx, spec, "", nil)
}

// create is Create, or Restore from the checkpoint in image when not "";
// a warm sandbox's main process also gets start, the read end of the pipe
// its task will come through (see KeepWarm).
func (r *Runtime) create(ctx context.Context, spec sandbox.Spec, image string, start *os.File) (*sandbox.Handle, error) {
	if err := validateSpec(spec, r.opts.DataRoot); err != nil {
		return nil, fmt.Errorf("validate sandbox spec: %w", err)
	}
	// A warm sandbox's own spec, or a restore, claims none.
	return r.Host.Create(ctx, spec, start == nil && image == "", func(spec sandbox.Spec) (*sandbox.Handle, error) {
		return r.createCold(ctx, spec, image, start)
	})
}

// createCold starts spec's sandbox cold (warmpool.Host.Create's cold):
// its mounts resolved, its id locked, no sandbox of its id there.
func (r *Runtime) createCold(ctx context.Context, spec sandbox.Spec, image string, start *os.File) (*sandbox.Handle, error) {
	caps, _ := r.Capabilities(ctx)
	if !caps.Available {
		return nil, fmt.Errorf("create sandbox %s: %s: %w", spec.ID, caps.Reason, errdefs.ErrFailedPrecondition)
	}
	dir := r.Dir.Path(spec.ID)
	// A directory without state.json is a Create that crashed before it
	// started anything; start over, and forget a container runsc may have
	// registered for it.
	if err := r.Dir.RemoveLeftovers(nil, spec.ID, image != ""); err != nil {
		return nil, fmt.Errorf("clean state dir: %w", err)
	}
	if err := r.release(ctx, state{Launch: statedir.Launch{ID: spec.ID}}); err != nil {
		return nil, fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state dir: %w", err)
	}
	e, err := r.start(ctx, spec, dir, image, start)
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}
	r.Dir.Set(spec.ID, e)
	if image != "" {
		r.wake(ctx, spec.ID)
	}
	r.log.Info("sandbox started", logkey.SandboxID, spec.ID, "launcher_pid", e.St.PID, "restored", image != "", "uid", e.St.Identity.UID)
	return r.Handle(e.St), nil
}

var _ sandbox.Checkpointer = (*Runtime)(nil)

// Checkpoint saves running sandbox id's memory and processes into dir
// with `runsc checkpoint`, which ends the sandbox once saved (about 0.1 s
// for a small one under ptrace, and the time to write its memory), then
// releases it but for its identity's lease.
func (r *Runtime) Checkpoint(ctx context.Context, id, dir string) error {
	unlock := r.Dir.Lock(id)
	defer unlock()
	e, err := r.Lookup(id)
	if err != nil {
		return err
	}
	if !e.Running() {
		return fmt.Errorf("checkpoint sandbox %s: it has ended: %w", id, errdefs.ErrFailedPrecondition)
	}
	start := time.Now()
	oomBefore, _ := cgroups.OOMKills(e.St.Cgroups)
	// The save's buffers and the image's page cache count against the
	// sandbox's memory limit, paused as it is: room for them
	// (cgroups.RaiseMemory), so that a sandbox near its limit is not
	// OOM-killed mid-save.
	putBack, err := cgroups.RaiseMemory(e.St.Cgroups, raisedRecord(e.Dir))
	if err != nil {
		r.log.Warn("cannot give a checkpoint room above the sandbox's memory limit", logkey.SandboxID, id, logkey.Error, err)
	}
	args := append(append([]string{"checkpoint", "--image-path=" + dir}, r.image.CheckpointFlags(dir)...), e.St.container())
	if _, err := r.runsc(ctx, args...); err != nil {
		// This runsc ends a sandbox whose checkpoint failed (one of its
		// processes held a connection to a host socket, say): wait for
		// its end, so that Status says so. runsc state may still find it
		// for a moment as it goes (a loaded host's moment:
		// TestSessionKeepsItsMemory saw one), so one it finds is given
		// a few seconds to end; one that runs on after them is woken.
		wait := 10 * time.Second
		if _, serr := r.runsc(ctx, "state", e.St.container()); serr == nil {
			wait = 3 * time.Second
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		ended := e.WaitExit(wctx) == nil
		cancel()
		if !ended {
			r.wake(context.WithoutCancel(ctx), e.St.container())
			if err := putBack(); err != nil {
				r.log.Warn("cannot put the memory limit of a sandbox whose checkpoint failed back", logkey.SandboxID, id, logkey.Error, err)
			}
		}
		return fmt.Errorf("checkpoint sandbox %s: %w", id, cgroups.KilledInSave(err, e.St.Cgroups, oomBefore))
	}
	saved := time.Now()
	if err := e.WaitExit(ctx); err != nil {
		return fmt.Errorf("checkpoint sandbox %s: wait for it to end: %w", id, err)
	}
	ended := time.Now()
	if err := r.Retire(ctx, id); err != nil {
		return err
	}
	// Where a checkpoint's time goes: runsc's save, its end, Corral's
	// clean-up.
	r.log.Debug("sandbox checkpointed", logkey.SandboxID, id, "saved", saved.Sub(start), "ended", ended.Sub(saved), "retired", time.Since(ended))
	return nil
}

// Restore makes sandbox spec.ID from the checkpoint in dir: Create, with
// `runsc restore` in place of `runsc run`.
func (r *Runtime) Restore(ctx context.Context, spec sandbox.Spec, dir string) (*sandbox.Handle, error) {
	if dir == "" || !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("restore sandbox %s: checkpoint directory %q: must be an absolute path: %w", spec.ID, dir, errdefs.ErrInvalidArgument)
	}
	return r.create(ctx, spec, dir, nil)
}

var _ sandbox.Forker = (*Runtime)(nil)

// Fork makes sandbox spec.ID from sandbox from's checkpoint in dir, as
// Restore does, as from's host identity: gVisor's sentry checks a file's
// host owner against the uid of the process that opens it, which the
// restored processes keep. Each gVisor sandbox's sentry runs as nobody
// and its gofer as root whatever that uid is, so sharing it gives the
// fork no reach on the host that its source did not have; the fork's
// directory is given to that uid as the source's is.
func (r *Runtime) Fork(ctx context.Context, from string, spec sandbox.Spec, dir string) (*sandbox.Handle, error) {
	if _, err := r.opts.Identities.Share(from, spec.ID); err != nil {
		return nil, fmt.Errorf("fork sandbox %s: %w", from, err)
	}
	h, err := r.Restore(ctx, spec, dir)
	if err != nil {
		// A restore that failed keeps its lease for a retry; a fork
		// is not retried under its id.
		r.opts.Identities.Release(spec.ID)
	}
	return h, err
}

// wake sends SIGCONT to the main process of the sandbox runsc knows as
// container: a checkpoint's end.
func (r *Runtime) wake(ctx context.Context, container string) {
	if _, err := r.runsc(ctx, "kill", container, "CONT"); err != nil {
		r.log.Warn("cannot wake a sandbox's main process", logkey.SandboxID, container, logkey.Error, err)
	}
}

// launcherScript waits at its gate: reads a line from its stdin, a pipe
// the server writes once the sandbox's state is on disk, and exits 125
// without running anything if the pipe closes first (the server died);
// then, with /dev/null for stdin, runs runsc (its arguments after the exit
// file's path) as a child and records its exit status in the exit file,
// atomically, when it ends. The paths are arguments, never part of the
// script.
const launcherScript = `f=$1; shift; read -r _ || exit 125; exec </dev/null; "$@"; rc=$?; echo $rc > "$f.tmp" && mv -f "$f.tmp" "$f"; exit $rc`

// warmLauncherScript is launcherScript for a warm sandbox: runsc's stdin,
// which runsc hands the sandbox's main process, is the start pipe (fd 3),
// and its stdout the acknowledgement file (fd 4); runsc writes nothing of
// its own there (its diagnostics go to stderr and its log). Inside,
// warmShim puts them where warmstart says.
const warmLauncherScript = `f=$1; shift; read -r _ || exit 125; "$@" <&3 >&4 3<&- 4>&-; rc=$?; echo $rc > "$f.tmp" && mv -f "$f.tmp" "$f"; exit $rc`

// start builds the bundle and cgroups for spec in dir, starts the launcher
// (running runsc restore from image, if not "") and waits until the
// container runs. A warm sandbox's (start not nil) gets start as its
// stdin and its acknowledgement file as its stdout.
func (r *Runtime) start(ctx context.Context, spec sandbox.Spec, dir, image string, start *os.File) (_ *statedir.Entry[state], err error) {
	st := state{Launch: statedir.Launch{ID: spec.ID, Labels: maps.Clone(spec.Labels), CreatedAt: time.Now().UTC()}}
	if st.Identity, err = r.opts.Identities.Take(spec.ID); err != nil {
		return nil, err
	}
	defer func() {
		// A restore that failed keeps the lease: its processes run as
		// this identity when it is tried again.
		if err != nil && image == "" {
			r.opts.Identities.Release(spec.ID)
		}
	}()
	cgPath := ""
	if r.cg != nil {
		if st.Cgroups, err = r.cg.Create(spec.ID, r.hostLimits(spec.Limits)); err != nil {
			return nil, fmt.Errorf("create cgroups: %v: %w", err, errdefs.ErrUnavailable)
		}
		defer func() {
			if err != nil {
				cgroups.KillAndRemove(st.Cgroups)
			}
		}()
		cgPath = r.cg.Path(spec.ID)
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
	bundle := filepath.Join(dir, "bundle")
	o := r.opts
	o.Host = st.Identity // the sandbox's own: its process's uid, its files'
	if err := writeBundle(bundle, spec, o, cgPath); err != nil {
		return nil, err
	}
	// O_APPEND: the sentry writes stdout and stderr through two host fds
	// of one file, each at its own offset; without it they overwrite each
	// other.
	out, err := os.OpenFile(filepath.Join(dir, "output.log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create output file: %w", err)
	}
	defer out.Close()

	// The exit file's path is relative to the launcher's working
	// directory, the state dir, which a claim renames to the task's id.
	script, extra := launcherScript, []*os.File(nil)
	if start != nil {
		script = warmLauncherScript
		ack, err := warmpool.OpenAck(dir)
		if err != nil {
			return nil, err
		}
		defer ack.Close()
		extra = []*os.File{start, ack} // fds 3 and 4
	}
	argv := []string{"/bin/sh", "-c", script, "sh", "exit", r.opts.Runsc}
	argv = append(argv, r.globalArgs()...)
	argv = append(argv, "--log="+filepath.Join(dir, "runsc.log"))
	if image != "" {
		argv = append(append(argv, "restore", "--image-path="+image), r.image.Restore...)
	} else {
		argv = append(argv, "run")
	}
	argv = append(argv, "--bundle", bundle, spec.ID)
	if image != "" && r.opts.Subreaper != "" {
		argv = append([]string{r.opts.Subreaper, "worker", "subreaper"}, argv...)
	}
	// Not CommandContext: the sandbox must outlive ctx and this process.
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.ExtraFiles = extra
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.Stdout, cmd.Stderr = out, out
	// The launcher waits at its gate until the state below is written: a
	// server that dies before leaves a launcher that exits, runsc never
	// run, and never a sandbox no state names.
	gate, letGo, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("create launcher gate: %w", err)
	}
	defer gate.Close()
	defer letGo.Close()
	cmd.Stdin = gate
	// Own session, no Pdeathsig: a server killed with SIGKILL leaves the
	// sandbox running and a new server recovers it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start runsc: %w", err)
	}
	st.PID = cmd.Process.Pid
	// Our unreaped child cannot be replaced by another process with the
	// same pid, so this start time is the launcher's.
	st.PIDStart, _ = hostproc.StartTime(st.PID)
	e := statedir.Started[state](dir, cmd)
	e.St = st
	defer func() {
		if err != nil {
			// runsc first, then its record: a runsc run cut in its
			// start goes on to write the record after a delete that
			// came before it (TestCreateCancelledLeavesNothing). What
			// it started in the cgroups goes with them, above.
			syscall.Kill(-st.PID, syscall.SIGKILL)
			<-e.Done()
			if err := r.release(context.Background(), st); err != nil {
				r.log.Warn("cannot make runsc forget a sandbox whose start failed", logkey.SandboxID, spec.ID, logkey.Error, err)
			}
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
	if err := r.waitRunning(ctx, e); err != nil {
		return nil, err
	}
	return e, nil
}

// hostLimits are the cgroup limits for a sandbox with limits lim: memory
// with the sentry's overhead, the pids backstop, the CPU quota as is.
func (r *Runtime) hostLimits(lim sandbox.Limits) sandbox.Limits {
	out := lim
	if lim.MemoryBytes > 0 {
		out.MemoryBytes = lim.MemoryBytes + r.opts.MemoryOverhead
	}
	if lim.Pids > 0 {
		out.Pids = PidsBackstop(lim.Pids)
	}
	return out
}

// PidsBackstop is the host pids cgroup limit for a sandbox whose processes
// are limited to n inside: measured with the ptrace platform, the sentry
// and gofer take about 40 host tasks and each sandboxed process about ten
// more (its stub process and the sentry thread serving it).
func PidsBackstop(n int64) int64 { return 128 + 16*n }

// waitRunning waits until the container runs or has already exited, or
// the launcher is gone, reading runsc's record of the container every
// 5 ms (runscStatus). A runsc started per poll, as before, cost about
// 40 ms each and up to 90 ms of a restore's answer: it ran beside the
// restore on the same cores, to no use, then slept up to 50 ms. A runsc
// that keeps its record elsewhere (none readable after runscRecordWait)
// is asked with `runsc state`, every 10 polls, and a warning says so.
func (r *Runtime) waitRunning(ctx context.Context, e *statedir.Entry[state]) error {
	start := time.Now()
	for i := 1; ; i++ {
		if _, err := os.Stat(filepath.Join(e.Dir, "exit")); err == nil {
			return nil // ran and exited already
		}
		status := r.runscStatus(e.St.container())
		if status == "running" || status == "stopped" {
			return nil
		}
		if status == "" && i%10 == 0 && time.Since(start) > runscRecordWait {
			out, err := r.runsc(ctx, "state", e.St.container())
			var s struct {
				Status string `json:"status"`
			}
			if err == nil && json.Unmarshal(out, &s) == nil && (s.Status == "running" || s.Status == "stopped") {
				r.log.Warn("runsc keeps no record of its containers where this runtime reads it: each sandbox's start waits for runsc state", logkey.SandboxID, e.St.ID, "waited", time.Since(start))
				return nil
			}
		}
		select {
		case <-e.Done():
			if _, err := os.Stat(filepath.Join(e.Dir, "exit")); err == nil {
				return nil
			}
			return fmt.Errorf("runsc exited: %s", statedir.Tail(filepath.Join(e.Dir, "output.log")))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// runscRecordWait is how long waitRunning reads runsc's record alone:
// runsc writes it within moments of starting, seconds on a host this
// loaded.
const runscRecordWait = 10 * time.Second

// runscKnows reports whether runsc's root holds anything of container id
// (runsc keeps a container's record there under its id: a directory, or
// files named <id>_sandbox:<id>.*, as runsc 20221219 does); true when the
// root cannot be read, false when there is none.
func (r *Runtime) runscKnows(id string) bool {
	ents, err := os.ReadDir(filepath.Join(r.opts.StateDir, "runsc"))
	if err != nil {
		return !os.IsNotExist(err) // unreadable: it may
	}
	return slices.ContainsFunc(ents, func(e os.DirEntry) bool { return e.Name() == id || strings.HasPrefix(e.Name(), id+"_") })
}

// runscRecord is the path, less its suffix, of runsc's record of
// container id in its root: <sandbox>_sandbox:<container>.state (JSON)
// and .lock, as runsc 20221219 and later keep it; a sandbox here is its
// one container.
func (r *Runtime) runscRecord(id string) string {
	return filepath.Join(r.opts.StateDir, "runsc", id+"_sandbox:"+id)
}

// runscStatus is container id's status as runsc records it in its root
// (runscRecord), read without starting a runsc; "" when there is no such
// record or it is half written.
func (r *Runtime) runscStatus(id string) string {
	b, err := os.ReadFile(r.runscRecord(id) + ".state")
	if err != nil {
		return ""
	}
	var s struct {
		Status string `json:"status"`
	}
	if json.Unmarshal(b, &s) != nil {
		return ""
	}
	return s.Status
}

// exitStatus is how the exited sandbox ended: the launcher's record of
// runsc's exit status, and the memory cgroup's OOM counter.
func (r *Runtime) exitStatus(e *statedir.Entry[state]) sandbox.ExitStatus {
	es := sandbox.ExitStatus{Code: -1}
	path := filepath.Join(e.Dir, "exit")
	if b, err := os.ReadFile(path); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			es.Code = n
		}
		if fi, err := os.Stat(path); err == nil {
			es.ExitedAt = fi.ModTime().UTC()
		}
	} else {
		es.Message = "exit status unknown: the launcher ended without recording it"
		if fi, err := os.Stat(filepath.Join(e.Dir, "state.json")); err == nil {
			es.ExitedAt = fi.ModTime().UTC()
		}
	}
	if n, _ := cgroups.OOMKills(e.St.Cgroups); n > 0 {
		es.OOMKilled = true
		es.Message = "OOMKilled"
		if es.Code == 0 || es.Code == -1 {
			es.Code = 137
		}
	} else {
		statedir.Explain(&es, e.Dir)
	}
	// Create returns once runsc runs, and a claim once the start is
	// sent: either is so only after a restart, or for a worker that could
	// not acknowledge its start (and so ran none of it).
	switch {
	case !ranRunsc(e.Dir):
		es.NotStarted, es.Message = true, "its launcher never ran it: the server died before letting it go"
	case e.St.Warm != "" && !warmpool.Acked(e.Dir):
		es.NotStarted, es.Message = true, "its worker never had its task's start: the server died between the claim and the start"
	}
	return es
}

// ranRunsc reports whether the launcher of the sandbox in dir ran runsc,
// which makes its log file first thing.
func ranRunsc(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "runsc.log"))
	return err == nil
}

// crash calls Options.Crash at point, if set.
func (r *Runtime) crash(point string) {
	if r.opts.Crash != nil {
		r.opts.Crash(point)
	}
}

// Recover reattaches to the sandbox h names (statedir.Sandboxes.Recover)
// once its start is decided: a launcher still at its gate, whose server
// died before letting it go, ends in moments (its gate closed with the
// server); one that has not run runsc after statedir.DecideWithin is killed, so
// nothing of its task runs after all, and its end says so
// (ExitStatus.NotStarted). So is a claimed warm sandbox whose worker has
// not acknowledged its start: its start pipe closed with the server.
//
// A memory limit a checkpoint raised and its server did not put back (it
// died in the save, and the sandbox runs on) is put back.
func (r *Runtime) Recover(ctx context.Context, h *sandbox.Handle) error {
	err := r.RecoverDecided(ctx, h, func(e *statedir.Entry[state]) bool {
		return !ranRunsc(e.Dir) || (e.St.Warm != "" && !warmpool.Acked(e.Dir))
	})
	if err != nil {
		return err
	}
	if e, lerr := r.Lookup(h.ID); lerr == nil {
		if err := cgroups.PutBack(raisedRecord(e.Dir)); err != nil {
			r.log.Warn("cannot put back the memory limit a checkpoint raised", logkey.SandboxID, h.ID, logkey.Error, err)
		}
	}
	return nil
}

// raisedRecord is where a checkpoint writes down its raise of the memory
// limit of the sandbox whose state is in dir (cgroups.RaiseMemory).
func raisedRecord(dir string) string { return filepath.Join(dir, "memory-raised") }

// term sends SIGTERM to the main process with `runsc kill`; when it exits,
// gVisor ends the whole sandbox. An error is a container that exited
// meanwhile.
func (r *Runtime) term(ctx context.Context, e *statedir.Entry[state]) {
	r.runsc(ctx, "kill", e.St.container(), "TERM")
}

// kill SIGKILLs every process in the sandbox (runsc kill --all) and waits
// for the launcher, taking the launcher's session down when runsc cannot.
func (r *Runtime) kill(ctx context.Context, e *statedir.Entry[state]) error {
	if _, err := r.runsc(ctx, "kill", "--all", e.St.container(), "KILL"); err != nil && e.Running() {
		// runsc does not know the container (it is still being created, or
		// runsc's state is gone): end the launcher's whole session.
		r.log.Debug("runsc kill failed", logkey.SandboxID, e.St.ID, "err", err)
		syscall.Kill(-e.St.PID, syscall.SIGKILL)
	}
	// The sandbox ends within a few hundred milliseconds of SIGKILL; give
	// it 10 s before taking the launcher's session down.
	kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := e.WaitExit(kctx)
	cancel()
	if err != nil && ctx.Err() == nil {
		syscall.Kill(-e.St.PID, syscall.SIGKILL)
		err = e.WaitExit(ctx)
	}
	return err
}

// release makes runsc forget the sandbox, whose runsc has ended: runsc
// run deletes its container when it ends; this is for one whose runsc was
// killed. When runsc has nothing of it left (it ended by itself, as at a
// checkpoint's end), no runsc is started for nothing (10 to 40 ms of a
// suspend). A runsc run killed before it wrote the container's state
// leaves its lock file alone, which runsc delete, finding no container,
// leaves too. An error (a runsc delete cut short by ctx, say) means runsc
// may still know the sandbox: Destroy then keeps its state dir, so that a
// later Destroy, or the next start's reconcile, releases it again.
func (r *Runtime) release(ctx context.Context, st state) error {
	id := st.container()
	if !r.runscKnows(id) {
		return nil
	}
	if out, err := r.runsc(ctx, "delete", "--force", id); err != nil && !bytes.Contains(out, []byte("does not exist")) {
		return err
	}
	record := r.runscRecord(id)
	if _, err := os.Lstat(record + ".state"); os.IsNotExist(err) {
		if err := os.Remove(record + ".lock"); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("remove runsc's lock file of a container it never recorded: %w", err)
		}
	}
	if r.runscKnows(id) {
		return fmt.Errorf("runsc delete left its record of %s", id)
	}
	return nil
}
