package app

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/corral-dev/corral/internal/execagent"
	"github.com/corral-dev/corral/internal/worker"
	"github.com/corral-dev/corral/internal/workerproto"
)

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
	log := slog.New(slog.NewTextHandler(stderr, nil)).With("task_id", opts.TaskID)
	return worker.Run(ctx, opts, log)
}

// RunSessionAgent is a session sandbox's main process, corral worker
// session: the exec agent, dialling the server's unix socket with the
// session's id and token from environ, and running the commands it is
// sent with environ's other variables, until ctx ends. Without a session
// in environ it only waits.
func RunSessionAgent(ctx context.Context, environ []string, stderr io.Writer) int {
	// The session's token is in the environment, and the commands this
	// process runs are of its uid: as a task's worker does, it keeps the
	// token from them.
	environ, err := worker.HideFromAgent(environ, workerproto.EnvSessionToken)
	if err != nil {
		fmt.Fprintf(stderr, "corral worker session: hide the session's token from its commands: %v\n", err)
		return 1
	}
	var id, token string
	var egress bool
	var env []string
	for _, kv := range environ {
		switch k, v, _ := strings.Cut(kv, "="); {
		case k == workerproto.EnvSessionID:
			id = v
		case k == workerproto.EnvSessionToken:
			token = v
		case k == workerproto.EnvSessionEgress:
			egress = v != ""
		case !strings.HasPrefix(k, workerproto.EnvPrefix):
			env = append(env, kv) // the token never reaches a command
		}
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if id == "" || token == "" {
		<-ctx.Done()
		return 0
	}
	if egress {
		// The sandbox has loopback only: the relay is its one way to the
		// session's egress proxy, as a task's worker does it.
		relay, err := worker.StartRelay(workerproto.DefaultEgressListen, worker.SocketUpstream(workerproto.EgressDir+"/"+workerproto.EgressSocket), log)
		if err != nil {
			fmt.Fprintf(stderr, "corral worker session: %v\n", err)
			return 1
		}
		defer relay.Close()
		env = append(env, worker.ProxyEnv(relay.Addr())...)
	}
	sock := workerproto.SocketDir + "/" + workerproto.SocketName
	if err := execagent.Run(ctx, sock, "/api/sessions/"+id+"/agent", token, env, log); err != nil {
		fmt.Fprintf(stderr, "corral worker session: %v\n", err)
		return 1
	}
	return 0
}
