// Package workerproto is the contract between the server and the worker
// that runs in every sandbox (`corral worker run-task`, run from
// corral-worker): where things are
// inside the sandbox, the worker's arguments (built by the server with
// Args.Argv and read by the worker with ParseArgs, one tested pair), the
// environment variables it reads, the status.json it leaves, and which
// values are secrets to redact. The server side and the worker import it;
// neither imports the other.
package workerproto

import (
	"context"
	"net"
	"path/filepath"
	"strconv"
)

// Paths inside every sandbox.
const (
	// TaskDir is the task's directory, read-write.
	TaskDir = "/task"
	// PromptFile is the prompt, in TaskDir.
	PromptFile = "prompt.md"
	// StatusFile is what the worker leaves in TaskDir when its agent ends.
	StatusFile = "status.json"
	// HomeDir is the agent's HOME beneath TaskDir (not for the task's
	// results), kept so a follow-up can resume the agent's session.
	HomeDir = ".home"
	// SharedDir is shared/, read-only.
	SharedDir = "/workspace/shared"
	// CorralBinary is the corral executable, mounted read-only, for the
	// agent's own use of it (`corral mcp --session`).
	CorralBinary = "/run/corral/" + CorralName
	// WorkerBinary is corral-worker, mounted read-only: the sandbox's main
	// process, `corral-worker worker run-task|warm|session`. It is the
	// corral binary's `worker` command built without the server's
	// packages, which starts faster and idles smaller.
	WorkerBinary = "/run/corral/" + WorkerName
	// CorralName and WorkerName are the two executables' file names, on
	// the host (side by side) and in the sandbox.
	CorralName = "corral"
	WorkerName = "corral-worker"
	// WorkerPackage is corral-worker's main package.
	WorkerPackage = "github.com/corral-dev/corral/cmd/corral-worker"
	// SocketDir holds the servers' unix sockets (ServerSocket); the
	// directory is mounted, not a socket, so a restarted server's new
	// socket is seen.
	SocketDir  = "/run/corral/sock"
	SocketName = "corral.sock"
	// ExecInputDir and ExecOutputDir are where a code_execute call finds
	// its attachments and context files (the task's context/, read-only)
	// and leaves its output files (the task's output/).
	ExecInputDir = "/workspace/input"
	// ProjectDir is where a workspace task finds its named workspace,
	// read-write: the agent's working directory.
	ProjectDir    = "/workspace/project"
	ExecOutputDir = "/workspace/output"
	// EgressDir holds the task's egress proxy socket, EgressSocket, mounted
	// the same way.
	EgressDir    = "/run/corral/egress"
	EgressSocket = "proxy.sock"
	// SelfDir holds SelfFile, the id of the session whose sandbox this
	// is (read-only, a directory of the server's per session): a
	// session's exec agent reads it before each dial, so that an agent
	// restored from another session's memory (a fork's) dials as the
	// session it now serves.
	SelfDir  = "/run/corral/self"
	SelfFile = "session-id"
)

// WorkerProcs is the most Ps (GOMAXPROCS) a worker runs with: all it
// uses. Go sizes its runtime for GOMAXPROCS Ps before main runs, and sets
// it from the host's CPUs: a sandbox has no /sys/fs/cgroup to show its CPU
// limit, and gVisor shows every host CPU. So the sandboxes whose main
// process lives long (a warm sandbox's, which idles and is one of many;
// a session's) start it with EnvMaxProcs set to this, and every worker
// caps it as it starts. What they run gets its own environment (a task's,
// a command's), never this variable.
const WorkerProcs = 2

// ExitNoTask is the exit code of a warm pod's worker that got no task:
// the server refused its poll (it destroyed the pod, or is a server that
// did not make it) or could not be reached. The kubernetes runtime reads
// it, on a claimed pod, as a task whose start never reached its worker
// (the server died between the claim and the poll's answer). 75 is
// sysexits' EX_TEMPFAIL: try again.
const ExitNoTask = 75

// MaxProcsEnv is the environment entry that starts a long-lived worker
// with WorkerProcs Ps (EnvMaxProcs).
func MaxProcsEnv() string { return EnvMaxProcs + "=" + strconv.Itoa(WorkerProcs) }

// The worker's environment.
const (
	// EnvPrefix starts every variable the worker reads; the agent gets
	// none of them.
	EnvPrefix = "CORRAL_"
	// EnvTaskID is the task's id.
	EnvTaskID = "CORRAL_TASK_ID"
	// EnvWebhookKey holds the task's webhook key, hex-encoded. It is the
	// only way the key reaches the worker (not a flag, which ps would
	// show).
	EnvWebhookKey = "CORRAL_WEBHOOK_KEY"
	// EnvImage names the image the sandbox runs, on the runtimes that run
	// images, so the worker can say an agent is missing from it.
	EnvImage = "CORRAL_IMAGE"
	// EnvSessionID and EnvSessionToken name the session an agent runs its
	// commands in and a token of that session's own (a secret).
	EnvSessionID = "CORRAL_SESSION_ID"
	// EnvServerSocket is the ServerSocket a session's exec agent dials.
	EnvServerSocket = "CORRAL_SERVER_SOCKET"
	// EnvServerURL is, in a remote runtime's sandbox (a pod, which
	// cannot reach a socket of the server's host), the server's URL
	// (http or https) a session's exec agent dials instead of
	// EnvServerSocket.
	EnvServerURL = "CORRAL_SERVER_URL"
	// EnvWarmID and EnvWarmToken are, in a warm pod, its id and the
	// token (a secret of its own) with which its worker polls the server
	// at EnvServerURL for its task.
	EnvWarmID       = "CORRAL_WARM_ID"
	EnvWarmToken    = "CORRAL_WARM_TOKEN"
	EnvSessionToken = "CORRAL_SESSION_TOKEN"
	// EnvEgressCA is the certificate (DER, base64) of the CA under which
	// the egress proxy intercepts the hosts that have credential rules,
	// for a sandbox with network: the worker and a session's agent make
	// the programs they run trust it. Not a secret; its key stays with
	// the server.
	EnvEgressCA = "CORRAL_EGRESS_CA"
	// EnvMaxProcs is Go's GOMAXPROCS (WorkerProcs), which the server sets
	// for a warm sandbox's and a session's main process.
	EnvMaxProcs = "GOMAXPROCS"
	// EnvSessionEgress says a session's sandbox has its egress proxy
	// mounted at EgressDir: its exec agent relays to it.
	EnvSessionEgress = "CORRAL_SESSION_EGRESS"
	// EnvSessionEgressAddr and EnvSessionEgressKey are, in a remote
	// runtime's session sandbox (a pod, which mounts no socket of the
	// server's host), the server's egress listener (host:port) its exec
	// agent relays to instead, and the session's key for it
	// (egress.SessionKey, hex; a secret).
	EnvSessionEgressAddr = "CORRAL_SESSION_EGRESS_ADDR"
	EnvSessionEgressKey  = "CORRAL_SESSION_EGRESS_KEY"
)

// AgentConfig is how the server has the worker start one agent: its
// binary, extra arguments, and environment.
type AgentConfig struct {
	Binary string
	Args   []string
	// Env is the environment configured (KEY=VALUE), secrets included;
	// never logged, and every secret of it redacted from what a worker
	// reports.
	Env []string
	// SandboxEnv is what a sandbox gets of Env: its API keys replaced by
	// placeholders, its model APIs' base URLs left out; the egress adds
	// the keys to the requests for Models.
	SandboxEnv []string
	Models     []ModelAPI
}

// ModelAPI is a model API the egress relays for an agent, adding its key:
// the worker points the variable BaseURLVar at its relay, and the relay's
// requests go to Base with Header: Value added.
type ModelAPI struct {
	BaseURLVar    string
	Base          string
	Header, Value string
}

// ServerSocket is the socket a host's sandbox dials to reach replica, the
// server that started it: "<replica>.sock" in SocketDir. SocketName there
// is the host's shared socket, which one replica on the host serves at any
// time (its lock decides which; the next takes it over when that one
// stops): DialServer falls back to it when the replica is gone, and any
// replica takes any task's report, or a session's exec agent (adopting
// the session).
func ServerSocket(replica string) string {
	if replica == "" {
		return SocketDir + "/" + SocketName
	}
	return SocketDir + "/" + replica + ".sock"
}

// DialServer dials sock, a ServerSocket, and, when nothing answers there
// (its replica stopped), the host's shared socket beside it.
func DialServer(ctx context.Context, sock string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sock)
	if err == nil || ctx.Err() != nil {
		return conn, err
	}
	shared := filepath.Join(filepath.Dir(sock), SocketName)
	if shared == sock {
		return nil, err
	}
	if conn, serr := d.DialContext(ctx, "unix", shared); serr == nil {
		return conn, nil
	}
	return nil, err
}
