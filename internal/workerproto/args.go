package workerproto

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/rtkind"
)

// Defaults of the arguments.
const (
	DefaultMaxLogBytes  = 64 << 20
	DefaultGrace        = 10 * time.Second
	DefaultEgressListen = "127.0.0.1:3128"
	DefaultSource       = rtkind.Local
)

// Args are the arguments of `corral worker run-task`. The server builds
// the command line with Argv; the worker reads it with ParseArgs.
type Args struct {
	TaskID     string
	TaskDir    string   // default TaskDir
	PromptPath string   // default TaskDir/prompt.md
	Agent      string   // adapter name; the worker picks one when empty
	Model      string   // passed to the agent
	Binary     string   // overrides the agent's binary
	AgentArgs  []string // appended to the adapter's arguments (agents.NAME.args)
	Resume     string   // an agent session to continue (claude --resume)
	Continue   bool     // continue the agent's last conversation in WorkDir (claude --continue)
	WorkDir    string   // where the agent runs; default TaskDir
	Command    []string // argv of the command agent, after --

	WebhookURL string // http(s)://host/path or unix:///path; "" skips the webhook
	Source     string // X-Webhook-Source: the runtime; default "local"

	// EgressSocket is the server's egress proxy socket; "" means no
	// network: no relay and no proxy variables for the agent.
	EgressSocket string
	// EgressAddr is, for a sandbox on another machine (a Kubernetes
	// pod), the server's egress listener (host:port), in place of
	// EgressSocket: the relay dials it and proves the task with the
	// webhook key (egress.DialTask).
	EgressAddr string
	// EgressListen is where the relay listens; default 127.0.0.1:3128.
	EgressListen string
	// EgressForward are loopback addresses (host:port) the egress policy
	// names: each is forwarded, at the same address inside the sandbox,
	// through the proxy to that address on the server's host.
	EgressForward []string
	// EgressModels are the variables that point the agent at its model
	// APIs (ANTHROPIC_BASE_URL, ...), in the order of the task's proxy's
	// (egress.Policy.Models): the worker sets the i-th to a relay on the
	// sandbox's loopback that tunnels to the proxy's model API i, which
	// adds the key the sandbox never holds.
	EgressModels []string

	MaxLogBytes int64         // per log file; default 64 MiB
	Grace       time.Duration // SIGTERM → SIGKILL; default 10s
}

// Argv is the command line for a, after the binary: "worker", "run-task",
// then a flag for every field that is set, then "--" and Command.
func (a Args) Argv() []string {
	argv := []string{"worker", "run-task"}
	str := func(flag, v string) {
		if v != "" {
			argv = append(argv, "--"+flag, v)
		}
	}
	str("prompt", a.PromptPath)
	str("task-id", a.TaskID)
	str("task-dir", a.TaskDir)
	str("webhook", a.WebhookURL)
	str("source", a.Source)
	str("agent", a.Agent)
	str("agent-binary", a.Binary)
	for _, v := range a.AgentArgs {
		argv = append(argv, "--agent-arg", v) // "" too: an argument of its own
	}
	str("model", a.Model)
	str("resume", a.Resume)
	str("work-dir", a.WorkDir)
	if a.Continue {
		argv = append(argv, "--continue")
	}
	if a.MaxLogBytes > 0 {
		str("max-log-bytes", strconv.FormatInt(a.MaxLogBytes, 10))
	}
	if a.Grace > 0 {
		str("grace", a.Grace.String())
	}
	str("egress-socket", a.EgressSocket)
	str("egress-addr", a.EgressAddr)
	str("egress-listen", a.EgressListen)
	for _, f := range a.EgressForward {
		str("egress-forward", f)
	}
	for _, v := range a.EgressModels {
		str("egress-model", v)
	}
	if len(a.Command) > 0 {
		argv = append(append(argv, "--"), a.Command...)
	}
	return argv
}

// ParseArgs reads the arguments after "run-task" and fills the defaults.
// Every problem is returned at once, as errdefs.FieldErrors joined, with
// the arguments as read, so a caller can add its own checks' problems.
func ParseArgs(argv []string) (Args, error) {
	var a Args
	fs := flag.NewFlagSet("run-task", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&a.PromptPath, "prompt", "", "the prompt file, fed to the agent's stdin (default TASK_DIR/prompt.md)")
	fs.StringVar(&a.TaskID, "task-id", "", "the task's id")
	fs.StringVar(&a.WebhookURL, "webhook", "", "where to POST the completion: http(s)://host/path or unix:///path/to/socket")
	fs.StringVar(&a.Agent, "agent", "", "the agent: claude, gemini, codex, opencode or command (default command when argv follows --, else claude)")
	fs.StringVar(&a.Model, "model", "", "the model to ask the agent for")
	fs.StringVar(&a.Binary, "agent-binary", "", "the agent's binary, if not its default name")
	fs.Func("agent-arg", "an argument appended to the agent's (repeatable, in order)", func(s string) error {
		a.AgentArgs = append(a.AgentArgs, s)
		return nil
	})
	fs.StringVar(&a.Resume, "resume", "", "the agent session to continue (claude)")
	fs.StringVar(&a.WorkDir, "work-dir", "", "where the agent runs (default TASK_DIR): a workspace task's project")
	fs.BoolVar(&a.Continue, "continue", false, "continue the agent's last conversation in the work dir (claude)")
	fs.StringVar(&a.TaskDir, "task-dir", TaskDir, "the task directory")
	fs.StringVar(&a.Source, "source", DefaultSource, "the webhook's source: the runtime that ran the worker")
	fs.Int64Var(&a.MaxLogBytes, "max-log-bytes", DefaultMaxLogBytes, "the most bytes kept per log file")
	fs.DurationVar(&a.Grace, "grace", DefaultGrace, "how long the agent gets between SIGTERM and SIGKILL")
	fs.StringVar(&a.EgressSocket, "egress-socket", "", "the server's egress proxy socket; the agent reaches it through a relay on --egress-listen")
	fs.StringVar(&a.EgressAddr, "egress-addr", "", "the server's egress listener (host:port), for a sandbox on another machine; instead of --egress-socket")
	fs.StringVar(&a.EgressListen, "egress-listen", DefaultEgressListen, "where the egress relay listens")
	fs.Func("egress-forward", "a loopback host:port to forward, at the same address, through the egress proxy to the server's host (repeatable)", func(s string) error {
		a.EgressForward = append(a.EgressForward, s)
		return nil
	})
	fs.Func("egress-model", "a variable pointing the agent at a model API, set to a relay through which the egress proxy adds its key (repeatable, in the proxy's order)", func(s string) error {
		a.EgressModels = append(a.EgressModels, s)
		return nil
	})
	if err := fs.Parse(argv); err != nil {
		return Args{}, fmt.Errorf("parse run-task arguments: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	if fs.NArg() > 0 {
		a.Command = fs.Args()
	}
	if a.PromptPath == "" {
		a.PromptPath = strings.TrimRight(a.TaskDir, "/") + "/" + PromptFile
	}

	var errs []error
	if a.TaskID == "" {
		errs = append(errs, errdefs.Field("--task-id", "is required"))
	} else if strings.ContainsAny(a.TaskID, "/\x00") || a.TaskID == "." || a.TaskID == ".." {
		errs = append(errs, errdefs.Field("--task-id", "must not contain '/' or NUL"))
	}
	if a.MaxLogBytes <= 0 {
		errs = append(errs, errdefs.Field("--max-log-bytes", "must be positive"))
	}
	if a.Grace <= 0 {
		errs = append(errs, errdefs.Field("--grace", "must be positive"))
	}
	if _, _, err := net.SplitHostPort(a.EgressListen); err != nil {
		errs = append(errs, errdefs.Field("--egress-listen", "must be host:port"))
	}
	for _, f := range a.EgressForward {
		if err := checkForward(f, a.EgressListen); err != nil {
			errs = append(errs, &errdefs.FieldError{Field: "--egress-forward", Err: err})
		}
	}
	if a.EgressAddr != "" {
		if a.EgressSocket != "" {
			errs = append(errs, errdefs.Field("--egress-addr", "and --egress-socket exclude each other"))
		}
		if _, port, err := net.SplitHostPort(a.EgressAddr); err != nil || port == "" {
			errs = append(errs, errdefs.Field("--egress-addr", "must be host:port"))
		}
	}
	if len(a.EgressForward) > 0 && a.EgressSocket == "" && a.EgressAddr == "" {
		errs = append(errs, errdefs.Field("--egress-forward", "needs --egress-socket or --egress-addr"))
	}
	for _, v := range a.EgressModels {
		if !validEnvName(v) {
			errs = append(errs, errdefs.Field("--egress-model", fmt.Sprintf("%q is not a variable name", v)))
		}
	}
	if len(a.EgressModels) > 0 && a.EgressSocket == "" && a.EgressAddr == "" {
		errs = append(errs, errdefs.Field("--egress-model", "needs --egress-socket or --egress-addr"))
	}
	return a, errors.Join(errs...)
}

// checkForward checks a forwarded address: a loopback IP literal with a
// port, other than the relay's own address.
func checkForward(addr, relay string) error {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().IsLoopback() || ap.Port() == 0 {
		return fmt.Errorf("%q must be a loopback address with a port, e.g. 127.0.0.1:8080: %w", addr, errdefs.ErrInvalidArgument)
	}
	if r, err := netip.ParseAddrPort(relay); err == nil && r == ap {
		return fmt.Errorf("%q is where the egress relay listens: %w", addr, errdefs.ErrInvalidArgument)
	}
	return nil
}

// validEnvName reports whether s is a portable environment variable name.
func validEnvName(s string) bool {
	if s == "" || s[0] >= '0' && s[0] <= '9' {
		return false
	}
	for _, c := range s {
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
