package sandbox

// Crash points are the named instants of a task's start and end, in the
// order a task passes them, at which the fault tests (internal/e2e) have
// the server die: a runtime's and the scheduler's Options.Crash is called
// at each, and the server's, set from CORRAL_TEST_CRASH_AT, kills the
// process with SIGKILL at the one named. In production no hook is set.
const (
	// CrashClaimed: a warm sandbox is taken out of its pool for a task;
	// nothing of the task has moved.
	CrashClaimed = "claimed"
	// CrashMoved: the task's directories are the warm sandbox's slots,
	// their entries moved in; the sandbox is not yet the task's.
	CrashMoved = "moved"
	// CrashHandedOver: the warm sandbox is the task's (its state is named
	// after the task); its worker has not been sent the start.
	CrashHandedOver = "handed-over"
	// CrashSent: the start is sent to the warm sandbox's worker; Create
	// has not returned.
	CrashSent = "sent"
	// CrashLaunched: a cold sandbox's launcher (a task's, or a
	// session's) runs, held at its gate; its state is not written. On
	// docker: its container is created, not started.
	CrashLaunched = "launched"
	// CrashGated: the cold sandbox's state is written; its launcher is
	// not yet let go.
	CrashGated = "gated"
	// CrashCreated: Create returned (the worker has its start);
	// task_started is not recorded.
	CrashCreated = "created"
	// CrashStarted: task_started is recorded.
	CrashStarted = "started"
	// CrashExited: the sandbox's main process exited; the task's end is
	// not recorded.
	CrashExited = "exited"
	// CrashEnded: the task's end is recorded; its sandbox is not yet
	// destroyed.
	CrashEnded = "ended"
)

// CrashPoints are the crash points in the order a task passes them (the
// warm ones or the cold ones, not both).
var CrashPoints = []string{CrashClaimed, CrashMoved, CrashHandedOver, CrashSent, CrashLaunched, CrashGated,
	CrashCreated, CrashStarted, CrashExited, CrashEnded}

// The crash points of a cluster of replicas, which a task on one server
// never passes.
const (
	// CrashAdopted: a replica recorded task_adopted for a task of a
	// replica gone; it has not reattached to the task's sandbox.
	CrashAdopted = "adopted"
	// CrashDelivered: the leader's notification of a task was answered
	// 2xx; its success is not recorded.
	CrashDelivered = "delivered"
)

// ClusterCrashPoints are the replicas' crash points.
var ClusterCrashPoints = []string{CrashAdopted, CrashDelivered}

// CrashCheckpointed, a session's crash point: its sandbox is checkpointed
// (its memory on disk, its sandbox gone); session_suspended is not
// recorded.
const CrashCheckpointed = "checkpointed"

// CrashForkCopied, a session's crash point: a fork's directory holds its
// copy of the source's files; its sandbox is not started, and the fork
// not recorded.
const CrashForkCopied = "fork-copied"

// CrashForkSnapshot, a session's crash point: a running session is
// suspended with its memory for its forks, whose snapshot of it is whole;
// the session is not resumed, and no fork made.
const CrashForkSnapshot = "fork-snapshot"

// SessionCrashPoints are the sessions' crash points.
var SessionCrashPoints = []string{CrashCheckpointed, CrashForkCopied, CrashForkSnapshot}

// The crash points of a claim of a warm pod on Kubernetes, which passes
// CrashClaimed, CrashMoved, CrashHandedOver (there: the task's
// directories given to the pod's identity, and the binding of the task to
// the pod recorded beside its slots), then CrashSent (the waiting poll has
// taken the start; its answer is not written), and these two, in either
// order: the Job is patched while the answer goes out.
const (
	// CrashAnswered: a warm pod's poll was answered with its task's
	// start, written whole (its length said) and flushed to the pod.
	CrashAnswered = "answered"
	// CrashRelabelled: the claimed warm pod's Job is patched as the
	// task's sandbox (its labels, its owned directories, its deadline);
	// the binding's record beside the slots stays until the sandbox is
	// destroyed, and the refill of the pod's pool may be half done.
	CrashRelabelled = "relabelled"
)

// The crash points of a sandbox's Destroy on Kubernetes, each step of
// which a later Destroy (the next server's reconciliation) must be able
// to finish: the Job, held in the API by the runtime's finalizer until
// its directories are taken back, is what that Destroy finds.
const (
	// CrashJobDeleted: the sandbox's Job is deleted, held by the
	// runtime's finalizer; its pod may still run.
	CrashJobDeleted = "job-deleted"
	// CrashPodGone: the sandbox's pod is gone from the API; its Secret
	// and the directories it was given are not yet taken back.
	CrashPodGone = "pod-gone"
	// CrashReclaimed: the directories are the server's again; the Job's
	// finalizer is not yet removed.
	CrashReclaimed = "reclaimed"
)

// KubernetesCrashPoints are the crash points that no other runtime
// passes: of a claim of a warm pod, then of a Destroy.
var KubernetesCrashPoints = []string{CrashAnswered, CrashRelabelled, CrashJobDeleted, CrashPodGone, CrashReclaimed}
