//go:build linux

// Package docker runs sandboxes as containers of a Docker Engine, through
// its API (github.com/moby/moby/client, API 1.40 or newer: Docker 19.03+).
//
// Isolation: one container per sandbox, from the Spec's image (or
// Options.DefaultImage), with a read-only root file system, a private
// size-limited tmpfs /tmp, the Spec's mounts as bind mounts of data root
// paths, no network at all (network mode none: loopback only; egress goes
// through Corral's proxy over a unix socket in a mounted directory, as for
// the other runtimes), every capability dropped, no_new_privs, the
// engine's default seccomp profile, docker-init as pid 1 (it forwards
// signals and reaps orphans; not under runsc, which would leave its
// environment, the worker's, readable: the worker is pid 1 there, as in
// the gvisor runtime, and reaps orphans itself), hostname corral, memory (without swap), CPU
// and pids limits, and rlimits for open files, core files and file size.
// The engine's own OCI runtime runs it (runc), or another one it has
// registered (Options.Runtime: runsc for gVisor).
//
// Identity: the container's processes run as Options.Host, the reserved
// host identity (uid and gid 1900000000 under a root server), inside as on
// the host: without user namespace remapping, an engine cannot tell the
// two apart, and uid 1000 inside would be uid 1000 on the host, which is a
// person's account on most machines. Read-write mounts are given to that
// identity for the sandbox's life and taken back by Destroy (package
// sandbox/hostuser), as for the other host runtimes.
//
// State: the engine is the source of truth. A container is named
// corral-<instance>-<id> and labelled with its sandbox id, the runtime and
// the instance (a hash of the data root), so that two Corral servers on one
// engine never see each other's sandboxes; List and Recover find
// containers by label and name after a restart. Containers are not
// removed when they exit (their exit code and OOM flag stay readable);
// Destroy removes them.
//
// Warm containers (KeepWarm, warm.go) are made ahead of need as a cold
// task's are, and handed to the task whose spec fits their shape.
//
// Exec uses the engine's exec API, as the sandbox's identity, under the
// container's seccomp profile and capability set. The engine cannot stop
// an exec'd command: when Exec's context ends it kills the command's host
// process (possible only with an engine on this machine).
package docker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/lockfile"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/cgroups"
	"github.com/corral-dev/corral/internal/sandbox/gvisor"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
	"github.com/corral-dev/corral/internal/sandbox/seccomp"
	"github.com/corral-dev/corral/internal/sandbox/statedir"
	"github.com/corral-dev/corral/internal/sandbox/warmpool"
)

var _ sandbox.Runtime = (*Runtime)(nil)

// Name is the runtime's name in Handles and configuration.
const Name = "docker"

// stateVersion is the schema version of state, stored in Handle.Version.
const stateVersion = 1

// labelOwned holds the read-write directories given to the sandbox
// identity and their owners before (JSON), for Destroy to give back; the
// other labels Corral puts on its containers are sandbox.LabelRuntime,
// LabelInstance and LabelSandbox.
const labelOwned = "corral.owned"

// Options configure a Runtime. Zero fields take the documented defaults.
type Options struct {
	// DataRoot is the data root's path on the engine's host, which mounts
	// are relative to (Mount.Source). Required, absolute.
	DataRoot string
	// Host is the engine's address; default unix:///var/run/docker.sock.
	// The engine must run on this machine: mounts are its host paths, and
	// read-write ones are handed to the sandbox identity here.
	Host string
	// Runtime is the OCI runtime the engine runs containers with, by the
	// name the engine registered it under (runsc); default the engine's.
	Runtime string
	// DefaultImage is the image of a Spec without one.
	DefaultImage string
	// Pull lets Create pull an image the engine does not have; otherwise
	// a missing image is an error that says so.
	Pull bool
	// TmpSize bounds the sandbox's /tmp in bytes; default 256 MiB.
	TmpSize int64
	// NoFile is the open files limit (RLIMIT_NOFILE); default 4096.
	NoFile int64
	// FileSizeLimit bounds any one file a sandbox's process writes
	// (RLIMIT_FSIZE); 0: no limit.
	FileSizeLimit int64
	// User is the identity of the container's processes, inside and on
	// the host; default hostuser.Default(). Never root. Under a root
	// server with the default, each container has one of its own from the
	// range above it (Identities).
	User hostuser.Identity
	// Identities leases each container its identity; default one over
	// StateDir/identities. Runtimes of one server share theirs.
	Identities *hostuser.Identities
	// Instance tells this server's containers from those of other servers
	// on the same engine; default a hash of DataRoot.
	Instance string
	// StateDir is a directory of the server's where workspaces under an
	// operator's roots are pinned for the containers that bind them
	// (hostuser.Pin), StateDir/.pins/<id>; default DataRoot/run/docker.
	StateDir string
	// Crash, when set, is called at sandbox.CrashLaunched, a container
	// created and not yet started (the fault tests: see sandbox.CrashPoints).
	Crash func(point string)
}

func (o *Options) setDefaults() {
	if o.Host == "" {
		o.Host = "unix:///var/run/docker.sock"
	}
	if o.TmpSize == 0 {
		o.TmpSize = 256 << 20
	}
	if o.NoFile == 0 {
		o.NoFile = 4096
	}
	if o.User == (hostuser.Identity{}) {
		o.User = hostuser.Default()
	}
	if o.StateDir == "" {
		o.StateDir = filepath.Join(o.DataRoot, "run", Name)
	}
	if o.Identities == nil {
		o.Identities = hostuser.NewIdentities(o.User, filepath.Join(o.StateDir, "identities"))
	}
	if o.Instance == "" {
		o.Instance = InstanceOf(o.DataRoot)
	}
}

// InstanceOf is the Instance of a server on data root dataRoot, by
// default: its containers carry it as sandbox.LabelInstance.
func InstanceOf(dataRoot string) string {
	sum := sha256.Sum256([]byte(dataRoot))
	return hex.EncodeToString(sum[:6])
}

// Runtime is the Docker runtime. Create it with New.
type Runtime struct {
	opts Options
	cli  *client.Client
	log  *slog.Logger
	// seccomp is the profile every container runs under (seccomp.OCIProfile).
	seccomp string

	caps sandbox.Probed

	// locks are held by Create, one stripe per sandbox id: a claim of a
	// warm container must not race another Create of its task.
	locks [64]sync.Mutex
	// warmTag is in the ids of the warm containers this runtime starts;
	// it holds warmLock while they are its own (warmpool.Prefix).
	warmTag  string
	warmLock *lockfile.File
	warmErr  error // why it has no tag
	// warm are the warm containers' pools (KeepWarm).
	warm *warmpool.Pools[*warmBox]
}

// state is Handle.State, version 1.
type state struct {
	ContainerID string `json:"container_id"`
}

// New returns a Runtime for the engine at opts.Host. It does not contact
// the engine: Capabilities does, and says when it cannot be reached.
func New(opts Options, log *slog.Logger) (*Runtime, error) {
	opts.setDefaults()
	if !filepath.IsAbs(opts.DataRoot) {
		return nil, fmt.Errorf("docker runtime data root %q: must be an absolute path: %w", opts.DataRoot, errdefs.ErrInvalidArgument)
	}
	if err := opts.User.Validate(""); err != nil {
		return nil, fmt.Errorf("docker runtime: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	cli, err := client.New(client.WithHost(opts.Host), client.WithAPIVersionNegotiation())
	if err != nil {
		return nil, fmt.Errorf("docker runtime: engine address: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	// The engine runs containers of this machine's architecture. runsc
	// answers EPERM for every refusal, and a refused clone3 must be
	// ENOSYS for C libraries to start threads with clone instead: under
	// runsc, clone3 is allowed (seccomp.GVisorOCIProfile says why).
	ociProfile := seccomp.OCIProfile
	if opts.Runtime == "runsc" {
		ociProfile = seccomp.GVisorOCIProfile
	}
	profile, err := ociProfile(runtime.GOARCH)
	if err != nil {
		return nil, err
	}
	r := &Runtime{opts: opts, cli: cli, log: log.With(logkey.Runtime, Name), seccomp: profile}
	// Warm containers are never reattached: a runtime starts its own,
	// under a tag of its own, and destroys those of runtimes gone at its
	// first contact with the engine (Capabilities). A state dir it cannot
	// write (corral doctor's, run by a person) leaves it without them.
	r.warmErr = os.MkdirAll(r.warmDir(), 0o711)
	if r.warmErr == nil {
		r.warmTag, r.warmLock, r.warmErr = warmpool.Own(r.warmDir())
	}
	r.warm = warmpool.New[*warmBox](Name, warmOps{r}, r.log)
	return r, nil
}

// Close releases the client's connections and the runtime's tag: a
// runtime made after it destroys the warm containers it left.
func (r *Runtime) Close() error { return errors.Join(r.cli.Close(), r.warmLock.Release()) }

// lock locks sandbox id's stripe and returns its unlock.
func (r *Runtime) lock(id string) (unlock func()) {
	h := fnv.New32a()
	h.Write([]byte(id))
	l := &r.locks[h.Sum32()%uint32(len(r.locks))]
	l.Lock()
	return l.Unlock
}

// crash calls the Crash hook, if any, at point.
func (r *Runtime) crash(point string) {
	if r.opts.Crash != nil {
		r.opts.Crash(point)
	}
}

// name is the container name of sandbox id.
func (r *Runtime) name(id string) string { return "corral-" + r.opts.Instance + "-" + id }

// Capabilities asks the engine once for its version and runtimes.
func (r *Runtime) Capabilities(ctx context.Context) (sandbox.Capabilities, error) {
	return r.caps.Get(ctx, func(ctx context.Context) sandbox.Capabilities {
		c := r.probe(ctx)
		if c.Available && r.warmErr == nil {
			r.destroyLeftoverWarm(context.WithoutCancel(ctx))
		}
		return c
	}), nil
}

func (r *Runtime) probe(ctx context.Context) sandbox.Capabilities {
	c := sandbox.Capabilities{Network: true, Limits: true, Exec: true}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := r.cli.ServerVersion(ctx, client.ServerVersionOptions{})
	if err != nil {
		c.Reason = fmt.Sprintf("the Docker engine at %s cannot be reached: %v (install: apt-get install -y docker.io, and start dockerd)", r.cli.DaemonHost(), err)
		return c
	}
	c.Version = fmt.Sprintf("Docker Engine %s (API %s)", v.Version, r.cli.ClientVersion())
	info, err := r.cli.Info(ctx, client.InfoOptions{})
	if err != nil {
		c.Reason = fmt.Sprintf("read the engine's runtimes: %v", err)
		return c
	}
	runtimes := slices.Sorted(maps.Keys(info.Info.Runtimes))
	if r.opts.Runtime != "" && !slices.Contains(runtimes, r.opts.Runtime) {
		c.Reason = fmt.Sprintf("the engine has no runtime %q (it has %s); register it in /etc/docker/daemon.json: %s",
			r.opts.Runtime, strings.Join(runtimes, ", "), runscHint)
		return c
	}
	rt := r.opts.Runtime
	if rt == "" {
		rt = info.Info.DefaultRuntime
	}
	if missing := missingRunscArgs(info.Info.Runtimes[rt].Path, info.Info.Runtimes[rt].Args); len(missing) > 0 {
		c.Reason = fmt.Sprintf("the engine runs runtime %q (gVisor) without %s in its runtimeArgs (/etc/docker/daemon.json): %s",
			rt, strings.Join(missing, " "), runscHint)
		return c
	}
	c.Version += fmt.Sprintf(", sandboxes under %s (registered: %s)", rt, strings.Join(runtimes, ", "))
	c.Available = true
	if filepath.Base(info.Info.Runtimes[rt].Path) == "runsc" {
		// Checkpoints under runsc alone (runc's need CRIU on the host,
		// not tried), through the engine's checkpoint API, which is
		// experimental.
		c.Checkpoint = info.Info.ExperimentalBuild
		if !c.Checkpoint {
			c.NoCheckpoint = "the engine's experimental features are off, and its checkpoints need them: a session's suspend keeps its files only"
		}
	}
	return c
}

// runscHint is how to register gVisor with an engine the way Corral needs.
const runscHint = `{"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none", "--oci-seccomp", "--host-uds=open"]}}}`

// missingRunscArgs are the flags Corral needs that a runsc runtime (by its
// path) lacks: --oci-seccomp (else gVisor ignores the seccomp profile) and
// --host-uds=open (else the worker cannot reach the server's sockets).
func missingRunscArgs(path string, args []string) []string {
	if filepath.Base(path) != "runsc" {
		return nil
	}
	var missing []string
	for _, want := range []string{"--oci-seccomp", "--host-uds=open"} {
		if !slices.ContainsFunc(args, func(a string) bool {
			return a == want || a == want+"=true" || (want == "--host-uds=open" && a == "--host-uds=all")
		}) {
			missing = append(missing, want)
		}
	}
	return missing
}

// classify turns an engine error into Corral's classes: a connection
// failure is ErrUnavailable (the scheduler may retry).
func classify(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case cerrdefs.IsNotFound(err):
		return fmt.Errorf("%s: %v: %w", op, err, errdefs.ErrNotFound)
	case client.IsErrConnectionFailed(err), cerrdefs.IsUnavailable(err):
		return fmt.Errorf("%s: %v: %w", op, err, errdefs.ErrUnavailable)
	case cerrdefs.IsConflict(err):
		return fmt.Errorf("%s: %v: %w", op, err, errdefs.ErrConflict)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// inspect returns the container of sandbox id. It wraps errdefs.ErrNotFound
// if there is none (or id is not valid): a checkpointed sandbox's is not
// its (inspectCheckpointed).
func (r *Runtime) inspect(ctx context.Context, id string) (container.InspectResponse, error) {
	return r.inspectNamed(ctx, id, r.name(id))
}

// inspectCheckpointed returns the container of checkpointed sandbox id.
func (r *Runtime) inspectCheckpointed(ctx context.Context, id string) (container.InspectResponse, error) {
	return r.inspectNamed(ctx, id, r.name(id)+checkpointedSuffix)
}

func (r *Runtime) inspectNamed(ctx context.Context, id, name string) (container.InspectResponse, error) {
	if sandbox.ValidateID(id) != nil {
		return container.InspectResponse{}, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	res, err := r.cli.ContainerInspect(ctx, name, client.ContainerInspectOptions{})
	if err != nil {
		return container.InspectResponse{}, classify("sandbox "+id, err)
	}
	c := res.Container
	if c.State == nil || c.Config == nil || c.Config.Labels[sandbox.LabelInstance] != r.opts.Instance {
		return container.InspectResponse{}, fmt.Errorf("sandbox %s: container %s is not this server's: %w", id, name, errdefs.ErrNotFound)
	}
	return c, nil
}

func (r *Runtime) handle(id, containerID string, labels map[string]string) *sandbox.Handle {
	b, _ := json.Marshal(state{ContainerID: containerID})
	own := maps.Clone(r.labelsOf(id, labels))
	for _, k := range []string{sandbox.LabelRuntime, sandbox.LabelInstance, sandbox.LabelSandbox} {
		delete(own, k)
	}
	return &sandbox.Handle{ID: id, Runtime: Name, Labels: own, Version: stateVersion, State: b}
}

// Create makes and starts the sandbox's container. It is idempotent on
// spec.ID: a container that exists is started if it has not been, and its
// handle returned.
//
// A spec that fits a warm pool's shape claims one of its containers
// instead (see KeepWarm), if one is ready.
func (r *Runtime) Create(ctx context.Context, spec sandbox.Spec) (*sandbox.Handle, error) {
	if err := r.opts.User.ValidateSpec(spec, r.opts.DataRoot); err != nil {
		return nil, fmt.Errorf("validate sandbox spec: %w", err)
	}
	unlock := r.lock(spec.ID)
	defer unlock()
	box := r.claimWarm(spec)
	if c, err := r.inspect(ctx, spec.ID); err == nil {
		if box != nil {
			box.pool.Release(box)
		}
		if err := r.start(ctx, c.ID); err != nil {
			return nil, err
		}
		return r.handle(spec.ID, c.ID, c.Config.Labels), nil
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		if box != nil {
			box.pool.Release(box)
		}
		return nil, err
	}
	if box != nil {
		h, err := r.adopt(ctx, spec, box)
		box.pool.Wake() // for the next box, now the claim is done
		if err == nil {
			return h, nil
		}
		r.log.Warn("warm container not usable; starting the task's cold", logkey.SandboxID, spec.ID, "warm_id", box.id, logkey.Error, err)
	}
	// A claim that crashed before its container took the task's name.
	os.Remove(r.claimPath(spec.ID))
	h, _, err := r.create(ctx, spec, false)
	return h, err
}

// create makes and starts spec's container (Create, unlocked and
// unclaimed). A warm one's (warm) keeps its stdin open: create attaches
// to it and to its stdout before the container starts, and returns the
// attachment (see KeepWarm).
func (r *Runtime) create(ctx context.Context, spec sandbox.Spec, warm bool) (*sandbox.Handle, *client.HijackedResponse, error) {
	caps, _ := r.Capabilities(ctx)
	if !caps.Available {
		return nil, nil, fmt.Errorf("create sandbox %s: %s: %w", spec.ID, caps.Reason, errdefs.ErrFailedPrecondition)
	}
	image := spec.Image
	if image == "" {
		image = r.opts.DefaultImage
	}
	if image == "" {
		return nil, nil, fmt.Errorf("create sandbox %s: no image, and no default image configured: %w", spec.ID, errdefs.ErrInvalidArgument)
	}
	if err := r.ensureImage(ctx, image); err != nil {
		return nil, nil, fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}
	spec = spec.Resolve(r.opts.DataRoot)
	pins := r.pins(spec.ID)
	if err := hostuser.Unpin(pins); err != nil { // a Create that crashed
		return nil, nil, fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}
	user, err := r.opts.Identities.Take(spec.ID)
	if err != nil {
		return nil, nil, fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}
	spec, err = hostuser.Pin(spec, pins, user)
	if err != nil {
		r.opts.Identities.Release(spec.ID)
		return nil, nil, fmt.Errorf("create sandbox %s: %w", spec.ID, err)
	}
	owned, err := hostuser.Give(hostuser.WritableDirs(spec.Mounts), user)
	undo := func() {
		hostuser.Reclaim(owned)
		hostuser.Unpin(pins)
		r.opts.Identities.Release(spec.ID)
	}
	if err != nil {
		undo()
		return nil, nil, err
	}
	cfg, host := r.containerConfig(spec, image, user)
	trees, err := json.Marshal(owned)
	if err != nil {
		undo()
		return nil, nil, err
	}
	cfg.Labels[labelOwned] = string(trees)
	if warm {
		cfg.OpenStdin, cfg.StdinOnce, cfg.AttachStdin, cfg.AttachStdout = true, true, true, true
	}
	res, err := r.cli.ContainerCreate(ctx, client.ContainerCreateOptions{Name: r.name(spec.ID), Config: cfg, HostConfig: host})
	if err != nil {
		undo()
		return nil, nil, classify("create sandbox "+spec.ID, err)
	}
	var att *client.HijackedResponse
	if warm {
		// Before its start: the engine closes the stdin of a container
		// with StdinOnce when its attachment ends, never one not yet
		// attached to.
		a, err := r.cli.ContainerAttach(ctx, res.ID, client.ContainerAttachOptions{Stream: true, Stdin: true, Stdout: true})
		if err != nil {
			r.cli.ContainerRemove(context.WithoutCancel(ctx), res.ID, client.ContainerRemoveOptions{Force: true})
			undo()
			return nil, nil, classify("attach to warm container "+spec.ID, err)
		}
		att = &a.HijackedResponse
	} else {
		r.crash(sandbox.CrashLaunched)
	}
	if err := r.start(ctx, res.ID); err != nil {
		if att != nil {
			att.Close()
		}
		r.cli.ContainerRemove(context.WithoutCancel(ctx), res.ID, client.ContainerRemoveOptions{Force: true})
		undo()
		return nil, nil, err
	}
	if !warm {
		r.log.Info("sandbox started", logkey.SandboxID, spec.ID, "container", res.ID[:12], "image", image)
	}
	return r.handle(spec.ID, res.ID, cfg.Labels), att, nil
}

// start starts a created container; one that runs or ran is left alone.
func (r *Runtime) start(ctx context.Context, containerID string) error {
	res, err := r.cli.ContainerInspect(ctx, containerID, client.ContainerInspectOptions{})
	if err != nil {
		return classify("start sandbox", err)
	}
	if res.Container.State.Status != container.StateCreated {
		return nil
	}
	if _, err := r.cli.ContainerStart(ctx, containerID, client.ContainerStartOptions{}); err != nil {
		return classify("start sandbox", err)
	}
	return nil
}

// HasImage returns nil if the engine has image, else an error saying it
// does not (errdefs.ErrNotFound) or why it cannot tell.
func (r *Runtime) HasImage(ctx context.Context, image string) error {
	_, err := r.cli.ImageInspect(ctx, image)
	if cerrdefs.IsNotFound(err) {
		return fmt.Errorf("image %s is not on the Docker engine: %w", image, errdefs.ErrNotFound)
	}
	return classify("image "+image, err)
}

// ensureImage makes sure the engine has image, pulling it if allowed.
func (r *Runtime) ensureImage(ctx context.Context, image string) error {
	_, err := r.cli.ImageInspect(ctx, image)
	if err == nil {
		return nil
	}
	if !cerrdefs.IsNotFound(err) {
		return classify("inspect image "+image, err)
	}
	if !r.opts.Pull {
		return fmt.Errorf("image %s is not on the Docker engine, and pulling is off (docker.pull: false): load it with docker load or docker pull first: %w", image, errdefs.ErrFailedPrecondition)
	}
	resp, err := r.cli.ImagePull(ctx, image, client.ImagePullOptions{})
	if err != nil {
		return classify("pull image "+image, err)
	}
	defer resp.Close()
	if err := resp.Wait(ctx); err != nil {
		return fmt.Errorf("pull image %s: %v: %w", image, err, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// containerConfig is the container for spec (mounts resolved to host
// paths) from image.
func (r *Runtime) containerConfig(spec sandbox.Spec, image string, user hostuser.Identity) (*container.Config, *container.HostConfig) {
	labels := maps.Clone(spec.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[sandbox.LabelRuntime] = Name
	labels[sandbox.LabelInstance] = r.opts.Instance
	labels[sandbox.LabelSandbox] = spec.ID
	dir := spec.Dir
	if dir == "" {
		dir = "/"
	}
	cfg := &container.Config{
		Image:      image,
		Entrypoint: spec.Command, // the image's entrypoint and command are not used
		Cmd:        nil,
		WorkingDir: dir,
		Env:        sandbox.DefaultEnv(spec.Env),
		User:       user.String(),
		Hostname:   "corral",
		Labels:     labels,
		StopSignal: "SIGTERM",
	}
	var mounts []mount.Mount
	for _, m := range spec.Mounts {
		mounts = append(mounts, mount.Mount{Type: mount.TypeBind, Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
	}
	ulimits := []*container.Ulimit{
		{Name: "nofile", Soft: r.opts.NoFile, Hard: r.opts.NoFile},
		{Name: "core", Soft: 0, Hard: 0},
	}
	if r.opts.FileSizeLimit > 0 {
		ulimits = append(ulimits, &container.Ulimit{Name: "fsize", Soft: r.opts.FileSizeLimit, Hard: r.opts.FileSizeLimit})
	}
	res := container.Resources{Ulimits: ulimits}
	if l := spec.Limits; l.MemoryBytes > 0 {
		res.Memory, res.MemorySwap = l.MemoryBytes, l.MemoryBytes
	}
	if l := spec.Limits; l.CPUMillis > 0 {
		res.NanoCPUs = l.CPUMillis * 1_000_000
	}
	if l := spec.Limits; l.Pids > 0 && r.opts.Runtime == "runsc" {
		// gVisor's sentry and gofer are in the container's cgroup and take
		// many host tasks: the limit is enforced inside, as RLIMIT_NPROC of
		// the sandbox user (gVisor counts per sandbox), with a host
		// backstop, as the gvisor runtime does.
		backstop := gvisor.PidsBackstop(l.Pids)
		res.PidsLimit = &backstop
		res.Ulimits = append(res.Ulimits, &container.Ulimit{Name: "nproc", Soft: l.Pids, Hard: l.Pids})
	} else if l.Pids > 0 {
		pids := l.Pids + 1 // docker-init is one of them
		res.PidsLimit = &pids
	}
	// docker-init starts with the worker's environment, secrets and all,
	// and runs as the sandbox's user: runc masks its /proc/1/environ
	// (maskedPaths), runsc applies no masked paths. Under runsc the
	// worker is pid 1 itself, as in the gvisor runtime: it reaps orphans
	// and forwards signals as docker-init would, and holds no secret in
	// its environment (workercmd's reap).
	init := r.opts.Runtime != "runsc"
	host := &container.HostConfig{
		NetworkMode:    "none",
		Mounts:         mounts,
		ReadonlyRootfs: true,
		Tmpfs:          map[string]string{"/tmp": fmt.Sprintf("rw,nosuid,nodev,size=%d", r.opts.TmpSize)},
		CapDrop:        []string{"ALL"},
		SecurityOpt:    []string{"no-new-privileges:true", "seccomp=" + r.seccomp},
		MaskedPaths:    maskedPaths(),
		ReadonlyPaths:  readonlyPaths(),
		Init:           &init,
		Runtime:        r.opts.Runtime,
		Resources:      res,
		LogConfig:      container.LogConfig{Type: "json-file", Config: map[string]string{"max-size": "1m", "max-file": "1"}},
	}
	return cfg, host
}

// Recover reattaches to the sandbox h names: its container must still
// exist and be the one h recorded.
func (r *Runtime) Recover(ctx context.Context, h *sandbox.Handle) error {
	st, err := statedir.DecodeHandle[state](h, Name, stateVersion)
	if err != nil {
		return fmt.Errorf("recover sandbox: %w", err)
	}
	c, err := r.inspect(ctx, h.ID)
	if err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	if st.ContainerID != "" && st.ContainerID != c.ID {
		return fmt.Errorf("recover sandbox %s: handle names another container than the engine: %w", h.ID, errdefs.ErrConflict)
	}
	// A memory limit a checkpoint raised, its server dying in the save:
	// put back if the container runs on, gone with it if not.
	if c.State.Running {
		if err := cgroups.PutBack(r.raisedRecord(h.ID)); err != nil {
			r.log.Warn("cannot put back the memory limit a checkpoint raised", logkey.SandboxID, h.ID, logkey.Error, err)
		}
	} else {
		os.Remove(r.raisedRecord(h.ID))
	}
	r.log.Debug("sandbox recovered", logkey.SandboxID, h.ID, "running", c.State.Running)
	return nil
}

// neverStarted is the end of a container still created, never started:
// Create starts what it creates before it returns, so one found so is a
// Create the server died in, and nothing of its command ran.
func neverStarted() sandbox.ExitStatus {
	return sandbox.ExitStatus{Code: -1, NotStarted: true, Message: "its container was created but never started: the server died between the two"}
}

// exitStatus is how the exited container c ended.
func exitStatus(c container.InspectResponse) sandbox.ExitStatus {
	es := sandbox.ExitStatus{Code: c.State.ExitCode}
	if t, err := time.Parse(time.RFC3339Nano, c.State.FinishedAt); err == nil && t.Year() > 1 {
		es.ExitedAt = t.UTC()
	}
	switch {
	case c.State.OOMKilled:
		es.OOMKilled = true
		es.Message = "OOMKilled"
		if es.Code == 0 {
			es.Code = 137
		}
	case c.State.Error != "":
		es.Message = c.State.Error
	}
	return es
}

// running reports whether the container's main process runs (or is being
// started or restarted by the engine).
func running(c container.InspectResponse) bool {
	return c.State.Running || c.State.Restarting || c.State.Paused || c.State.Status == container.StateCreated
}

// Wait blocks until the sandbox's main process exits or ctx is done.
func (r *Runtime) Wait(ctx context.Context, id string) (sandbox.ExitStatus, error) {
	c, err := r.inspect(ctx, id)
	if err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("wait: %w", err)
	}
	if c.State.Status == container.StateCreated {
		// The engine answers a wait on it at once, with exit code 0.
		return neverStarted(), nil
	}
	if err := r.waitExit(ctx, c.ID); err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("wait for sandbox %s: %w", id, err)
	}
	if c, err = r.inspect(ctx, id); err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("wait: %w", err)
	}
	return r.exitStatus(ctx, c), nil
}

// exitStatus is how the exited container c ended, with an OOM kill the
// engine's flag missed (see oomEvent) and, for a failure, what its main
// process said last.
func (r *Runtime) exitStatus(ctx context.Context, c container.InspectResponse) sandbox.ExitStatus {
	es := exitStatus(c)
	if r.warmNotStarted(ctx, c) {
		es.NotStarted, es.Message = true, "its worker never had its task's start: the server died between the claim and the start"
		return es
	}
	if !es.OOMKilled && es.Code == 137 && c.HostConfig != nil && c.HostConfig.Memory > 0 && r.oomEvent(ctx, c) {
		es.OOMKilled, es.Message = true, "OOMKilled"
	}
	if es.Message == "" {
		es.Message = sandbox.ExitMessage(es.Code, func() []byte { return r.outputEnd(ctx, c.ID) })
	}
	return es
}

// outputEnd is the end of the container's output, as the engine logged it
// (at most 1 MiB: see LogConfig); nil for none.
func (r *Runtime) outputEnd(ctx context.Context, containerID string) []byte {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	logs, err := r.cli.ContainerLogs(ctx, containerID, client.ContainerLogsOptions{ShowStdout: true, ShowStderr: true, Tail: "100"})
	if err != nil {
		return nil
	}
	defer logs.Close()
	var out bytes.Buffer
	stdcopy.StdCopy(&out, &out, io.LimitReader(logs, 2<<20)) // what came before an error is still its output
	return out.Bytes()
}

// oomEvent reports whether the engine logged an OOM event for the exited
// container c. Its State.OOMKilled is not enough: the engine sets it from
// the OOM event and resets it from the exit event, and under load the two
// come in either order.
func (r *Runtime) oomEvent(ctx context.Context, c container.InspectResponse) bool {
	f := client.Filters{}
	f.Add("type", "container")
	f.Add("container", c.ID)
	f.Add("event", "oom")
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ev := r.cli.Events(ctx, client.EventsListOptions{Since: c.Created, Until: strconv.FormatInt(time.Now().Add(time.Second).Unix(), 10), Filters: f})
	for {
		select {
		case m := <-ev.Messages:
			if m.Action == "oom" {
				return true
			}
		case <-ev.Err:
			return false
		}
	}
}

// waitExit blocks until the container is not running or ctx is done.
func (r *Runtime) waitExit(ctx context.Context, containerID string) error {
	w := r.cli.ContainerWait(ctx, containerID, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	select {
	case <-w.Result:
		return nil
	case err := <-w.Error:
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return classify("wait for container", err)
	}
}

// Status returns the sandbox's state as the engine sees it.
func (r *Runtime) Status(ctx context.Context, id string) (sandbox.Status, error) {
	c, err := r.inspect(ctx, id)
	if err != nil {
		return sandbox.Status{}, fmt.Errorf("status: %w", err)
	}
	s := sandbox.Status{}
	if t, err := time.Parse(time.RFC3339Nano, c.Created); err == nil {
		s.StartedAt = t.UTC()
	}
	switch {
	case c.State.Status == container.StateCreated:
		es := neverStarted()
		s.State, s.Exit, s.Message = sandbox.StateExited, &es, es.Message
	case running(c):
		s.State = sandbox.StateRunning
	default:
		es := r.exitStatus(ctx, c)
		s.State, s.Exit, s.Message = sandbox.StateExited, &es, es.Message
	}
	return s, nil
}

// Stop sends SIGTERM to the main process (docker-init passes it on; under
// runsc the worker, pid 1, passes it on to its child), waits
// up to grace, then SIGKILLs it, which ends every process in the
// container.
func (r *Runtime) Stop(ctx context.Context, id string, grace time.Duration) error {
	c, err := r.inspect(ctx, id)
	if err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	if !running(c) {
		return nil
	}
	if grace > 0 {
		if _, err := r.cli.ContainerKill(ctx, c.ID, client.ContainerKillOptions{Signal: "SIGTERM"}); err == nil {
			gctx, cancel := context.WithTimeout(ctx, grace)
			err := r.waitExit(gctx, c.ID)
			cancel()
			if err == nil {
				r.log.Info("sandbox stopped", logkey.SandboxID, id)
				return nil
			}
		}
		if ctx.Err() != nil {
			return fmt.Errorf("stop sandbox %s: %w", id, ctx.Err())
		}
	}
	// An error here is a container that exited meanwhile.
	r.cli.ContainerKill(ctx, c.ID, client.ContainerKillOptions{Signal: "SIGKILL"})
	if err := r.waitExit(ctx, c.ID); err != nil {
		return fmt.Errorf("stop sandbox %s: %w", id, err)
	}
	r.log.Info("sandbox killed", logkey.SandboxID, id, "grace", grace)
	return nil
}

// ownedTrees are the directories container c was given, as its label
// records them; a container made before the label existed was given its
// read-write binds by the server.
func ownedTrees(c container.InspectResponse) []hostuser.Tree {
	var trees []hostuser.Tree
	if c.Config != nil && json.Unmarshal([]byte(c.Config.Labels[labelOwned]), &trees) == nil {
		return trees
	}
	for _, m := range c.Mounts {
		if m.Type == mount.TypeBind && m.RW {
			trees = append(trees, hostuser.Tree{Dir: m.Source, Owner: hostuser.Identity{UID: os.Geteuid(), GID: os.Getegid()}})
		}
	}
	return trees
}

// List returns this server's containers whose labels include selector
// (a claimed warm container's are its task's: see KeepWarm).
func (r *Runtime) List(ctx context.Context, selector map[string]string) ([]sandbox.Handle, error) {
	f := client.Filters{}
	f.Add("label", sandbox.LabelRuntime+"="+Name, sandbox.LabelInstance+"="+r.opts.Instance)
	res, err := r.cli.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return nil, classify("list sandboxes", err)
	}
	var out []sandbox.Handle
	for _, c := range res.Items {
		name := ""
		if len(c.Names) > 0 {
			name = c.Names[0]
		}
		id := r.idOf(name, c.Labels)
		if sandbox.ValidateID(id) != nil || c.State == container.StateRemoving || c.State == container.StateDead {
			continue
		}
		h := r.handle(id, c.ID, c.Labels)
		if !matches(h.Labels, selector) {
			continue
		}
		out = append(out, *h)
	}
	return out, nil
}

// matches reports whether labels include selector.
func matches(labels, selector map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// Destroy removes the sandbox's container (killing what runs in it, or
// its checkpoint with it), takes back the directories it was given and
// removes its pins. Unknown ids return nil.
func (r *Runtime) Destroy(ctx context.Context, id string) error {
	c, err := r.inspect(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		c, err = r.inspectCheckpointed(ctx, id)
	}
	if errors.Is(err, errdefs.ErrNotFound) {
		// A Create that crashed after its pins or its identity's lease,
		// or a Destroy cut short once the engine had the container
		// removed: the directories it gave are handed back before its
		// identity may go to another sandbox.
		if trees, err := r.readDestroying(id); err == nil {
			if err := hostuser.Reclaim(trees); err != nil {
				return fmt.Errorf("destroy sandbox %s: %w", id, err)
			}
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("destroy sandbox %s: %w", id, err)
		}
		os.Remove(r.restoredMark(id))
		os.Remove(r.raisedRecord(id))
		os.Remove(r.claimPath(id))
		err := errors.Join(hostuser.Unpin(r.pins(id)), r.opts.Identities.Release(id))
		if err == nil {
			os.Remove(r.destroyingPath(id))
		}
		return err
	}
	if err != nil {
		return fmt.Errorf("destroy: %w", err)
	}
	trees := ownedTrees(c)
	if rec, err := r.readClaim(id); err == nil && rec.Container == c.ID {
		trees = append(trees, rec.Owned...) // a claimed warm container's task's
	}
	// Known to the next Destroy if this one is cut short after the
	// engine has removed the container, whose labels said them.
	if err := r.writeDestroying(id, trees); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", id, err)
	}
	if _, err := r.cli.ContainerRemove(ctx, c.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil && !cerrdefs.IsNotFound(err) {
		if !cerrdefs.IsConflict(err) {
			return classify("destroy sandbox "+id, err)
		}
		// Another Destroy's removal is under way (one cut short by a
		// shutdown, say): the container is gone when it ends.
		if err := r.waitRemoved(ctx, c.ID); err != nil {
			return fmt.Errorf("destroy sandbox %s: %w", id, err)
		}
	}
	if err := hostuser.Reclaim(trees); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", id, err)
	}
	if err := hostuser.Unpin(r.pins(id)); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", id, err)
	}
	if err := r.opts.Identities.Release(id); err != nil {
		return fmt.Errorf("destroy sandbox %s: %w", id, err)
	}
	os.Remove(r.restoredMark(id))
	os.Remove(r.raisedRecord(id))
	os.Remove(r.claimPath(id))
	os.Remove(r.destroyingPath(id))
	r.log.Info("sandbox destroyed", logkey.SandboxID, id)
	return nil
}

// destroyingPath records, while sandbox id is destroyed, the directories
// its container's removal hands back (Destroy).
func (r *Runtime) destroyingPath(id string) string {
	return filepath.Join(r.opts.StateDir, ".destroying", id+".json")
}

func (r *Runtime) writeDestroying(id string, trees []hostuser.Tree) error {
	return writeRecord(r.destroyingPath(id), trees)
}

// writeRecord writes v as JSON to p (0600, its directory 0700), whole or
// not at all.
func writeRecord(p string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	return statedir.WriteFileAtomic(p, b, 0o600)
}

func (r *Runtime) readDestroying(id string) ([]hostuser.Tree, error) {
	b, err := os.ReadFile(r.destroyingPath(id))
	if err != nil {
		return nil, err
	}
	var trees []hostuser.Tree
	if err := json.Unmarshal(b, &trees); err != nil {
		return nil, fmt.Errorf("read the directories a cut destroy left to hand back: %w", err)
	}
	return trees, nil
}

// pins is where sandbox id's workspaces are pinned.
func (r *Runtime) pins(id string) string { return filepath.Join(r.opts.StateDir, ".pins", id) }

// waitRemoved waits until the engine no longer knows containerID.
func (r *Runtime) waitRemoved(ctx context.Context, containerID string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		if _, err := r.cli.ContainerInspect(ctx, containerID, client.ContainerInspectOptions{}); cerrdefs.IsNotFound(err) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for the container's removal: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Exec runs req.Command in the running sandbox id through the engine's exec
// API and streams its output.
func (r *Runtime) Exec(ctx context.Context, id string, req sandbox.ExecRequest) (sandbox.ExitStatus, error) {
	c, err := r.inspect(ctx, id)
	if err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("exec: %w", err)
	}
	if err := req.Validate(); err != nil {
		return sandbox.ExitStatus{}, fmt.Errorf("exec in sandbox %s: %w", id, err)
	}
	if !c.State.Running {
		return sandbox.ExitStatus{}, fmt.Errorf("exec in sandbox %s: not running: %w", id, errdefs.ErrFailedPrecondition)
	}
	ex, err := r.cli.ExecCreate(ctx, c.ID, client.ExecCreateOptions{
		User:         c.Config.User, // the container's own identity
		Cmd:          req.Command,
		Env:          sandbox.DefaultEnv(req.Env),
		WorkingDir:   req.Dir,
		AttachStdin:  req.Stdin != nil,
		AttachStdout: true,
		AttachStderr: true,
	})
	if err != nil {
		if cerrdefs.IsConflict(err) {
			return sandbox.ExitStatus{}, fmt.Errorf("exec in sandbox %s: not running: %w", id, errdefs.ErrFailedPrecondition)
		}
		return sandbox.ExitStatus{}, classify("exec in sandbox "+id, err)
	}
	att, err := r.cli.ExecAttach(ctx, ex.ID, client.ExecAttachOptions{})
	if err != nil {
		return sandbox.ExitStatus{}, classify("exec in sandbox "+id, err)
	}
	defer att.Close()
	if req.Stdin != nil {
		go func() {
			io.Copy(att.Conn, req.Stdin)
			att.CloseWrite()
		}()
	}
	stdout, stderr := req.Stdout, req.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	copied := make(chan error, 1)
	go func() {
		_, err := stdcopy.StdCopy(stdout, stderr, att.Reader)
		copied <- err
	}()
	select {
	case err := <-copied:
		if err != nil {
			return sandbox.ExitStatus{}, fmt.Errorf("exec in sandbox %s: read output: %w", id, err)
		}
	case <-ctx.Done():
		r.killExec(ex.ID)
		att.Close()
		<-copied
		return sandbox.ExitStatus{}, ctx.Err()
	}
	// The output ends a moment before the engine records the exit code.
	for {
		in, err := r.cli.ExecInspect(ctx, ex.ID, client.ExecInspectOptions{})
		if err != nil {
			return sandbox.ExitStatus{}, classify("exec in sandbox "+id, err)
		}
		if !in.Running {
			return sandbox.ExitStatus{Code: in.ExitCode, ExitedAt: time.Now().UTC(), Message: sandbox.ExitMessage(in.ExitCode, nil)}, nil
		}
		select {
		case <-ctx.Done():
			r.killExec(ex.ID)
			return sandbox.ExitStatus{}, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// killExec kills an exec'd command through its host process: the engine
// has no API for it. It does nothing for an engine on another machine.
func (r *Runtime) killExec(execID string) {
	in, err := r.cli.ExecInspect(context.Background(), execID, client.ExecInspectOptions{})
	if err != nil || !in.Running || in.PID <= 0 || !strings.HasPrefix(r.cli.DaemonHost(), "unix://") {
		return
	}
	syscall.Kill(in.PID, syscall.SIGKILL)
}
