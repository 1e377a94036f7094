// Package workercmd is the worker's command line, `corral worker
// run-task|warm|session`: what a sandbox's main process runs (and
// `subreaper`, which the gvisor runtime runs on the host). corral
// and corral-worker (the binary sandboxes start, which links only this)
// both call Main.
package workercmd

import (
	"context"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/corral-dev/corral/internal/execagent"
	"github.com/corral-dev/corral/internal/sandbox/warmstart"
	"github.com/corral-dev/corral/internal/worker"
	"github.com/corral-dev/corral/internal/workerproto"
)

// Main runs `corral worker ARGS...` and returns the exit code: run-task,
// warm in a warm sandbox (until a task claims it), or session in a
// session's; on the host, subreaper under a gvisor restore's launcher
// (Subreaper). As its sandbox's pid 1 it is the reaper of orphans, and
// runs the worker as its child (reap).
func Main(ctx context.Context, args []string, stderr io.Writer) int {
	worker.CapProcs() // before anything here collects garbage
	if os.Getpid() == 1 {
		return reap(os.Environ(), stderr)
	}
	switch {
	case len(args) == 1 && args[0] == "session":
		return RunSessionAgent(ctx, os.Environ(), stderr)
	case len(args) == 1 && args[0] == "warm":
		return RunWarm(ctx, stderr)
	case len(args) > 0 && args[0] == "run-task":
		return RunWorker(ctx, args[1:], os.Environ(), stderr)
	case len(args) > 0 && args[0] == "subreaper":
		return Subreaper(args[1:], stderr)
	}
	fmt.Fprintln(stderr, "usage: corral worker run-task --prompt FILE --task-id ID --webhook URL [--agent NAME] [-- CMD ARGS...]")
	return worker.ExitUsage
}

// RunWorker is `corral worker run-task` inside a sandbox: it reads no
// configuration, only its arguments and the environment the runtime set,
// and returns the process exit code (the agent's).
func RunWorker(ctx context.Context, args, environ []string, stderr io.Writer) int {
	// First: the webhook key and a session's token are in the
	// environment already, and the agent to come runs as this uid.
	environ, err := worker.HideFromAgent(environ, workerproto.EnvWebhookKey, workerproto.EnvSessionToken)
	if err != nil {
		fmt.Fprintf(stderr, "corral worker run-task: hide the task's secrets from the agent: %v\n", err)
		return worker.ExitSetup
	}
	opts, err := worker.ParseArgs(args, environ)
	if err != nil {
		fmt.Fprintf(stderr, "corral worker run-task: %v\n", err)
		return worker.ExitUsage
	}
	// worker.Run adds the task's id to every line.
	return worker.Run(ctx, opts, slog.New(slog.NewTextHandler(stderr, nil)))
}

// RunWarm is `corral worker warm`, a warm sandbox's main process: it waits
// on warmstart.FD for the task that claims the sandbox and runs it, as
// the sandbox would have run it cold, in the task's directory with exactly
// the task's environment. The worker (corral worker run-task) runs in
// this process, without a second start of this binary, which is what a
// warm sandbox saves besides bubblewrap's set-up; any other argv is
// executed. The pipe closing with no task (the server destroyed the
// sandbox, or died) ends the process and so the sandbox, without a word on
// warmstart.AckFD: the server tells from that that no task ran here. A
// start, even one that does not decode, is acknowledged there before
// anything of it runs, and the descriptor closed.
func RunWarm(ctx context.Context, stderr io.Writer) int {
	// The threads the run keeps in reserve (worker.ReserveThreads), made
	// while the sandbox waits rather than after its task came: the run's
	// own call then finds them idle. Each new thread is a clone and some
	// ten system calls, under gVisor each a trip through its kernel.
	worker.ReserveThreads()
	worker.WarmUp()
	if os.Getenv(workerproto.EnvWarmToken) != "" {
		return runWarmPod(ctx, stderr)
	}
	f := os.NewFile(warmstart.FD, "warmstart")
	ack := os.NewFile(warmstart.AckFD, "warmstart-ack")
	if f == nil || ack == nil {
		fmt.Fprintf(stderr, "corral worker warm: no descriptors %d and %d to wait for a task on\n", warmstart.FD, warmstart.AckFD)
		return worker.ExitUsage
	}
	// Idle until a task comes, maybe for long, and one of many: give the
	// heap that package initialisation left behind back to the system.
	debug.FreeOSMemory()
	st, err := warmstart.Receive(f)
	f.Close()
	if errors.Is(err, warmstart.ErrNoTask) {
		ack.Close()
		return 0
	}
	if aerr := warmstart.Acknowledge(ack); aerr != nil {
		// Unacknowledged, the task is the server's to start again.
		fmt.Fprintf(stderr, "corral worker warm: %v\n", aerr)
		return worker.ExitSetup
	}
	if err != nil {
		fmt.Fprintf(stderr, "corral worker warm: %v\n", err)
		return worker.ExitSetup
	}
	return runStart(ctx, st, st.Env, stderr)
}

// runStart runs a warm sandbox's start st, with environ as its whole
// environment.
func runStart(ctx context.Context, st warmstart.Start, environ []string, stderr io.Writer) int {
	dir := st.Dir
	if dir == "" {
		dir = "/tmp"
	}
	if err := os.Chdir(dir); err != nil {
		fmt.Fprintf(stderr, "corral worker warm: %v\n", err)
		return worker.ExitSetup
	}
	// What this process's children inherit, as from a cold sandbox's
	// environment. /proc/self/environ keeps the warm sandbox's, which
	// holds no secret.
	os.Clearenv()
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			os.Setenv(k, v)
		}
	}
	if len(st.Argv) >= 3 && st.Argv[0] == workerproto.WorkerBinary && st.Argv[1] == "worker" && st.Argv[2] == "run-task" {
		// Where the kernel shows every process's environment (gVisor),
		// the worker executes itself again to hide the task's secrets
		// (worker.HideFromAgent), with os.Args: the task's, not the warm
		// sandbox's, which would wait for a start again.
		os.Args = st.Argv
		return RunWorker(ctx, st.Argv[3:], environ, stderr)
	}
	path, err := exec.LookPath(st.Argv[0])
	if err == nil {
		err = syscall.Exec(path, st.Argv, environ)
	}
	fmt.Fprintf(stderr, "corral worker warm: run %s: %v\n", st.Argv[0], err)
	return 127
}

// RunSessionAgent is a session sandbox's main process, corral worker
// session: the exec agent, dialling the server's unix socket (or, in a
// pod, the server's URL) with the session's id and token from environ,
// and running the commands it is sent with environ's other variables,
// until ctx ends. Without a session in environ it only waits.
func RunSessionAgent(ctx context.Context, environ []string, stderr io.Writer) int {
	// The session's token is in the environment, and the commands this
	// process runs are of its uid: as a task's worker does, it keeps the
	// token from them.
	environ, err := worker.HideFromAgent(environ, workerproto.EnvSessionToken, workerproto.EnvSessionEgressKey)
	if err != nil {
		fmt.Fprintf(stderr, "corral worker session: hide the session's token from its commands: %v\n", err)
		return 1
	}
	var id, token, serverURL string
	sock := workerproto.ServerSocket("")
	var egress bool
	var egressAddr string
	var egressKey, egressCA []byte
	var env []string
	for _, kv := range environ {
		switch k, v, _ := strings.Cut(kv, "="); {
		case k == workerproto.EnvSessionID:
			id = v
		case k == workerproto.EnvSessionToken:
			token = v
		case k == workerproto.EnvServerSocket:
			sock = v
		case k == workerproto.EnvServerURL:
			serverURL = v
		case k == workerproto.EnvSessionEgress:
			egress = v != ""
		case k == workerproto.EnvSessionEgressAddr:
			egressAddr = v
		case k == workerproto.EnvSessionEgressKey:
			if egressKey, err = hex.DecodeString(v); err != nil || len(egressKey) == 0 {
				fmt.Fprintf(stderr, "corral worker session: %s is not a hex key\n", workerproto.EnvSessionEgressKey)
				return 1
			}
		case k == workerproto.EnvEgressCA:
			if egressCA, err = worker.ParseEgressCA(v); err != nil {
				fmt.Fprintf(stderr, "corral worker session: %v\n", err)
				return 1
			}
		case k == workerproto.EnvMaxProcs:
			// The server's, for this process; a command that wants
			// another says so in its own environment.
		case !strings.HasPrefix(k, workerproto.EnvPrefix):
			env = append(env, kv) // the token never reaches a command
		}
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if id == "" || token == "" {
		<-ctx.Done()
		return 0
	}
	park := func(bool) {}
	if egress {
		// The sandbox has loopback only: the relay is its one way to the
		// session's egress proxy, as a task's worker does it: over the
		// mounted socket, or from a pod across the network to the
		// server's egress listener, proving the session with its key.
		up := worker.SocketUpstream(workerproto.EgressDir + "/" + workerproto.EgressSocket)
		if egressAddr != "" {
			if len(egressKey) == 0 {
				fmt.Fprintf(stderr, "corral worker session: %s without %s\n", workerproto.EnvSessionEgressAddr, workerproto.EnvSessionEgressKey)
				return 1
			}
			up = worker.TCPUpstream(egressAddr, id, egressKey)
		}
		relay, err := worker.StartRelay(workerproto.DefaultEgressListen, up, log)
		if err != nil {
			fmt.Fprintf(stderr, "corral worker session: %v\n", err)
			return 1
		}
		defer relay.Close()
		// Parked for a checkpoint, the relay lets go of its connections
		// to the host's proxy socket too.
		park = func(parked bool) {
			if parked {
				relay.Hold()
			} else if err := relay.Release(); err != nil {
				log.Warn("exec agent: the egress relay is down after a checkpoint", "err", err)
			}
		}
		env = append(env, worker.ProxyEnv(relay.Addr())...)
		if len(egressCA) > 0 {
			trust, err := worker.TrustEgressCA(os.TempDir(), egressCA)
			if err != nil {
				fmt.Fprintf(stderr, "corral worker session: %v\n", err)
				return 1
			}
			env = append(env, trust...)
		}
	}
	// Its commands share the session's pids limit with it.
	worker.ReserveThreads()
	dial := func(ctx context.Context) (net.Conn, error) { return workerproto.DialServer(ctx, sock) }
	prefix := ""
	if serverURL != "" {
		if dial, prefix, err = urlDialer(serverURL); err != nil {
			fmt.Fprintf(stderr, "corral worker session: %v\n", err)
			return 1
		}
	}
	path := func() string { return prefix + "/api/sessions/" + selfID(id) + "/agent" }
	if err := execagent.Run(ctx, dial, path, token, env, park, log); err != nil {
		fmt.Fprintf(stderr, "corral worker session: %v\n", err)
		return 1
	}
	return 0
}

// selfID is the id of the session whose sandbox this is: the one its
// server wrote in workerproto.SelfFile, else (none there: a pod's, or a
// session made before it) id, the one this process was started with.
// They differ in a fork's sandbox, restored from its source's memory.
func selfID(id string) string {
	b, err := os.ReadFile(workerproto.SelfDir + "/" + workerproto.SelfFile)
	if err != nil {
		return id
	}
	if s := strings.TrimSpace(string(b)); s != "" && len(s) <= 64 && strings.Trim(s, "abcdefghijklmnopqrstuvwxyz0123456789-") == "" {
		return s
	}
	return id
}

// urlDialer dials the server at rawURL (http or https), as a remote
// runtime's sandbox (a pod) reaches it, over TLS for https with the
// system's roots; prefix is the URL's path, before the server's routes.
func urlDialer(rawURL string) (dial func(context.Context) (net.Conn, error), prefix string, err error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, "", fmt.Errorf("%s %q: want an http(s) URL with a host", workerproto.EnvServerURL, rawURL)
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
	}
	if u.Scheme == "https" {
		d := &tls.Dialer{Config: &tls.Config{ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}}
		return func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }, strings.TrimSuffix(u.Path, "/"), nil
	}
	var d net.Dialer
	return func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }, strings.TrimSuffix(u.Path, "/"), nil
}
