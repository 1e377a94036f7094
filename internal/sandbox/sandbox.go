// Package sandbox defines the contract between the scheduler and the
// isolation backends (bubblewrap, gVisor, Docker, Kubernetes). It performs no
// I/O itself; sandbox/local and the other subpackages implement it and
// sandbox/sandboxtest holds a fake and the conformance suite.
package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"path/filepath"
	"slices"
	"time"

	"github.com/corral-dev/corral/internal/sandbox/warmstart"
)

// Runtime runs sandboxes on one kind of isolation backend.
//
// Implementations must be safe for concurrent use. Methods that take an id
// return an error wrapping errdefs.ErrNotFound if the backend does not know
// the id, and errdefs.ErrUnavailable for transient infrastructure failures
// (daemon down, API 503) that the scheduler may retry.
type Runtime interface {
	// Capabilities reports what this backend supports on this host. It is
	// called at startup; the result of a probe that ran to its end must
	// not change while the process runs, and one cut short by ctx must not
	// be kept (Probed keeps the one and not the other).
	Capabilities(ctx context.Context) (Capabilities, error)

	// Create provisions a sandbox for spec and starts its main process.
	// It is idempotent on spec.ID: if the sandbox already exists it returns
	// that sandbox's handle and a nil error, so a retry after a crash is safe.
	// The sandbox outlives the calling process: a server that dies leaves it
	// running, and a new one finds it again with Recover or List.
	Create(ctx context.Context, spec Spec) (*Handle, error)

	// Recover reattaches to a sandbox after corral restarts, using a Handle
	// that Create returned and an event recorded. It returns an error
	// wrapping errdefs.ErrNotFound if the sandbox is gone. It returns once
	// the sandbox's main process has its command or has ended without it
	// (a start the dead server was handing over when it died is decided in
	// moments, its pipe closed), so that Status tells a sandbox that never
	// started (ExitStatus.NotStarted) from one whose command ran.
	Recover(ctx context.Context, h *Handle) error

	// Exec runs a command in a running sandbox, streaming output to
	// req.Stdout and req.Stderr, and blocks until it exits or ctx is done.
	Exec(ctx context.Context, id string, req ExecRequest) (ExitStatus, error)

	// Wait blocks until the sandbox's main process exits or ctx is done.
	// It may be called any number of times, also after the process exited.
	Wait(ctx context.Context, id string) (ExitStatus, error)

	// Stop sends SIGTERM to the main process, waits up to grace, then kills
	// every process in the sandbox. Stopping a stopped sandbox returns nil.
	Stop(ctx context.Context, id string, grace time.Duration) error

	// Status returns the observed state. It never changes state.
	Status(ctx context.Context, id string) (Status, error)

	// List returns the sandboxes this backend knows whose labels include
	// every label in selector, running or exited but not yet destroyed.
	List(ctx context.Context, selector map[string]string) ([]Handle, error)

	// Destroy releases everything the sandbox holds: processes, mounts,
	// containers, pods, network, cgroups, and gives back the directories
	// it was given. Destroying an unknown id returns nil. A directory that
	// could not be given back whole is quarantined (ErrQuarantined).
	Destroy(ctx context.Context, id string) error
}

// Checkpointer is a Runtime that keeps a sandbox's memory and processes
// across a suspend, where its Capabilities say Checkpoint: Checkpoint
// saves them and ends the sandbox, Restore
// makes it again from what was saved, its processes going on where they
// were. A connected socket of the host's in the sandbox cannot be saved:
// its processes close theirs first (a session's exec agent parks).
type Checkpointer interface {
	// Checkpoint saves running sandbox id into dir (an empty host
	// directory, the server's alone) and ends it, releasing what it holds
	// as Destroy does but its host identity: a Restore under the same id
	// runs as the same identity, and a Destroy of the id ends that too.
	// If it fails, the sandbox may have ended with it (gVisor's runsc
	// ends it), as Status then says; one that runs on has its main
	// process sent SIGCONT.
	Checkpoint(ctx context.Context, id, dir string) error
	// Restore makes sandbox spec.ID from the checkpoint in dir, as Create
	// makes one, and sends its main process SIGCONT once it runs: the
	// sign that it was restored. spec is the spec the sandbox was made
	// with.
	Restore(ctx context.Context, spec Spec, dir string) (*Handle, error)
}

// Forker is a Checkpointer whose checkpoints restore into new sandboxes
// too: a session's forks start from its memory. The processes restored
// keep the host identity they ran as, which the new sandbox shares with
// the one checkpointed (hostuser.Identities.Share).
type Forker interface {
	Checkpointer
	// Fork makes sandbox spec.ID from the checkpoint in dir of sandbox
	// from, as Restore makes from's: spec is from's with the new
	// sandbox's id, directories and environment.
	Fork(ctx context.Context, from string, spec Spec, dir string) (*Handle, error)
}

// ErrNoCheckpoint wraps a Checkpoint error for a sandbox its runtime
// cannot checkpoint at all, left running as it was: no retry would keep
// its memory, and a suspend keeps its files alone.
var ErrNoCheckpoint = errors.New("this sandbox cannot be checkpointed")

// ErrQuarantined wraps a Destroy error for a directory the sandbox was given
// (a task's, a session's, a workspace) that could not be given back whole:
// it is left closed to all but the server until an operator looks.
var ErrQuarantined = errors.New("quarantined: the directory could not be given back whole, and is closed to all but the server")

// Handle is what the store persists to find a sandbox again after a restart.
type Handle struct {
	ID      string            `json:"id"`
	Runtime string            `json:"runtime"` // "local", "gvisor", "docker", "kubernetes"
	Labels  map[string]string `json:"labels,omitempty"`
	Version int               `json:"version"` // schema version of State; bump when State changes
	State   json.RawMessage   `json:"state"`   // backend-private: container ID, pid, pod name
}

// Mount makes a directory or file of the data root visible inside the
// sandbox. Each runtime decides how: the host runtimes bind
// <data root>/<Source>; a runtime on another machine mounts the same path
// of the volume holding the data root.
type Mount struct {
	Source   string // relative to the data root, slash-separated, within it; absolute when HostDir
	Target   string // absolute path inside the sandbox
	ReadOnly bool
	// HostDir marks Source as an absolute directory of the server's host
	// outside the data root: a workspace under an operator's
	// workspaces.roots. Only the runtimes on the server's host can mount
	// one; a runtime elsewhere refuses the spec.
	HostDir bool
}

// Resolve returns s with each mount's Source joined to root, the data
// root's path on this host, for a runtime that binds host paths. A HostDir
// mount's Source is a host path already.
func (s Spec) Resolve(root string) Spec {
	s.Mounts = slices.Clone(s.Mounts)
	for i, m := range s.Mounts {
		if !m.HostDir {
			s.Mounts[i].Source = filepath.Join(root, filepath.FromSlash(m.Source))
		}
	}
	return s
}

// Network is a sandbox's network policy.
type Network string

// Networks. NetworkNone leaves only loopback; NetworkEgress gives the
// sandbox a way out (through the egress proxy or directly).
const (
	NetworkNone   Network = "none"
	NetworkEgress Network = "egress"
)

// Limits bound a sandbox's resources. Zero means no limit of that kind.
type Limits struct {
	MemoryBytes int64
	CPUMillis   int64 // 1000 = one core
	Pids        int64
	WallClock   time.Duration
}

// Spec describes a sandbox to create.
type Spec struct {
	ID      string   // unique; lowercase letters, digits and hyphens
	Image   string   // container image; ignored by local runtimes
	Command []string // argv of the main process
	Dir     string   // working directory inside the sandbox
	Env     []string // KEY=VALUE; may contain secrets, never log the values
	Mounts  []Mount
	Limits  Limits
	Network Network
	Labels  map[string]string
}

// State is a sandbox's observed lifecycle state.
type State string

// States.
const (
	StateCreating State = "creating"
	StateRunning  State = "running"
	StateExited   State = "exited"
	StateUnknown  State = "unknown"
)

// ExitStatus is how a sandbox's main process (or an exec'd command) ended.
type ExitStatus struct {
	Code      int       `json:"code"`              // exit code; 128+n for signal n; -1 if unknown
	OOMKilled bool      `json:"oom_killed"`        // the memory limit killed it
	ExitedAt  time.Time `json:"exited_at"`         // zero if unknown
	Message   string    `json:"message,omitempty"` // e.g. "OOMKilled", "killed by signal 9"
	// DeadlineExceeded says the backend's own wall-clock limit
	// (Limits.WallClock) ended the sandbox, as a Kubernetes Job's
	// activeDeadlineSeconds does.
	DeadlineExceeded bool `json:"deadline_exceeded,omitempty"`
	// NotStarted says the sandbox's main process never had its command:
	// its start never reached it (the server died between a warm
	// sandbox's claim and its start, or before a launcher was let go), so
	// nothing of its task ran, and Code is not the command's. Only a
	// sandbox found again after a restart can say so.
	NotStarted bool `json:"not_started,omitempty"`
}

// Status is a sandbox's observed state.
type Status struct {
	State     State
	StartedAt time.Time
	Exit      *ExitStatus
	Message   string
}

// ExecRequest is a command to run in a running sandbox.
type ExecRequest struct {
	Command []string
	Dir     string
	Env     []string
	Stdin   io.Reader
	Stdout  io.Writer
	Stderr  io.Writer
}

// Capabilities says what a backend can do on this host.
type Capabilities struct {
	Available bool   // false: the backend cannot run sandboxes here; Reason says why
	Reason    string // what is missing and how to install it
	Limits    bool   // memory/CPU/pids limits are enforced
	// NoPidsLimit says Limits holds for memory and CPU only: the backend
	// cannot bound one sandbox's processes (Kubernetes: the node's
	// podPidsLimit applies).
	NoPidsLimit bool
	Network     bool   // network isolation is enforced
	Exec        bool   // Exec is supported
	Version     string // backend version, e.g. "bubblewrap 0.8.0"
	Warnings    []string
	// Checkpoint says the backend, a Checkpointer, can keep a sandbox's
	// memory and processes on this host; a suspend elsewhere keeps its
	// files only. NoCheckpoint says why it cannot, for one that could on
	// another host (docker under runsc on an engine without experimental
	// features, say) and how to let it.
	Checkpoint   bool
	NoCheckpoint string
}

// Labels every Corral sandbox carries, so reconciliation finds them.
const (
	LabelManaged = "corral.managed"
	LabelTaskID  = "corral.task-id"
)

// Labels the runtimes on a shared engine or cluster (docker, kubernetes)
// put on their sandboxes besides the Spec's: the runtime, the server
// instance that owns it (two servers on one engine never touch each
// other's) and the sandbox id.
const (
	LabelRuntime  = "corral.runtime"
	LabelInstance = "corral.instance"
	LabelSandbox  = "corral.sandbox-id"
)

// DefaultEnv is env with defaults for PATH, HOME (/tmp), USER, TMPDIR and
// LANG where env does not set them: a sandbox's process gets exactly this
// environment, nothing of the server's. Later entries win, as with execve.
func DefaultEnv(env []string) []string {
	return warmstart.Overlay([]string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/tmp",
		"USER=worker",
		"TMPDIR=/tmp",
		"LANG=C.UTF-8",
	}, env)
}

// Pid1Masked are the files of the sandbox's pid 1 under /proc/1 that a
// runtime whose pid 1 is a helper running as the sandbox's user (bwrap's
// reaper, docker-init) masks: the helper is dumpable, so without this the
// sandbox could write its memory (which no seccomp filter sees: it is an
// open(2)), and read its environment, which holds the worker's secrets
// (the task's webhook key), as the helper was started with them. The
// helper has one thread.
var Pid1Masked = []string{"mem", "task/1/mem", "environ", "task/1/environ"}

// ProcMasked are the /proc files every sandbox sees as empty (/dev/null):
// the kernel's memory, symbols, log and configuration, keyrings, timers
// and scheduler and slab statistics. ProcMaskedDirs are the /proc
// directories it sees empty, and ProcReadOnly those it can read but never
// write (/proc/sys above all: sysctls such as kernel.core_pattern). Not
// every kernel has every entry.
var (
	ProcMasked = []string{"kcore", "kallsyms", "kmsg", "keys", "key-users", "config.gz", "slabinfo",
		"latency_stats", "timer_list", "timer_stats", "sched_debug", "sysrq-trigger", "vmallocinfo",
		"pagetypeinfo", "kpagecount", "kpageflags", "kpagecgroup"}
	ProcMaskedDirs = []string{"acpi", "asound", "scsi", "driver"}
	ProcReadOnly   = []string{"sys", "bus", "fs", "irq"}
)
