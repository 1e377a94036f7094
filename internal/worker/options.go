package worker

import (
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/agent"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/webhook"
)

// EnvWebhookKey holds the task's webhook key, hex-encoded. It is the only
// way the key reaches the worker (not a flag, which ps would show), and it
// is removed, with every other CORRAL_* variable, before the agent starts.
const EnvWebhookKey = "CORRAL_WEBHOOK_KEY"

// Defaults.
const (
	DefaultTaskDir        = "/task"
	DefaultMaxLogBytes    = 64 << 20
	DefaultMaxOutputFiles = 1000
	DefaultGrace          = 10 * time.Second
)

// Options configure one worker run. ParseArgs builds them from the command
// line; tests fill them in.
type Options struct {
	TaskID     string
	TaskDir    string   // the task directory; default "/task"
	PromptPath string   // default TaskDir/prompt.md
	Agent      string   // adapter name; default "command" with Command, else "claude"
	Model      string   // passed to the agent
	Binary     string   // overrides the agent's binary
	Command    []string // argv of the command agent
	ExtraArgs  []string // appended to the agent's arguments
	Resume     string   // an agent session to continue (claude --resume)

	WebhookURL string // "" skips the webhook
	WebhookKey []byte // webhook.DeriveKey(secret, TaskID)
	Source     string // X-Webhook-Source; default "local"
	// Webhook tunes delivery (retries, backoff, clock); Source and Log are
	// filled in from the fields above.
	Webhook webhook.PostOptions

	// Env is the worker's environment. The agent gets it without CORRAL_*
	// variables, plus what its adapter adds.
	Env []string

	// EgressSocket is the server's egress proxy socket; "" means no
	// network: no relay and no proxy variables for the agent.
	EgressSocket string
	// EgressListen is where the relay listens; default 127.0.0.1:3128.
	EgressListen string
	// EgressForward are loopback addresses (host:port) the egress policy
	// names: each is forwarded, at the same address inside the sandbox,
	// through the proxy to that address on the server's host
	// (StartForward).
	EgressForward []string

	MaxLogBytes    int64         // per log file; default 64 MiB
	MaxOutputFiles int           // listed in status.json; default 1000
	Grace          time.Duration // SIGTERM → SIGKILL; default 10s

	// ProgressInterval is the least time between two progress reports
	// posted to the server; default DefaultProgressInterval. NoProgress
	// turns them off.
	ProgressInterval time.Duration
	NoProgress       bool

	// OnProgress, if set, receives the agent's progress items as they come,
	// from one goroutine that reads the agent's stdout; it must not block.
	OnProgress func(agent.Progress)
	// Now is the clock; default time.Now.
	Now func() time.Time
}

func (o *Options) defaults() {
	if o.TaskDir == "" {
		o.TaskDir = DefaultTaskDir
	}
	if o.PromptPath == "" {
		o.PromptPath = strings.TrimRight(o.TaskDir, "/") + "/prompt.md"
	}
	if o.Agent == "" {
		o.Agent = "claude"
		if len(o.Command) > 0 {
			o.Agent = "command"
		}
	}
	if o.Source == "" {
		o.Source = "local"
	}
	if o.EgressListen == "" {
		o.EgressListen = DefaultEgressListen
	}
	if o.MaxLogBytes <= 0 {
		o.MaxLogBytes = DefaultMaxLogBytes
	}
	if o.MaxOutputFiles <= 0 {
		o.MaxOutputFiles = DefaultMaxOutputFiles
	}
	if o.Grace <= 0 {
		o.Grace = DefaultGrace
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = DefaultProgressInterval
	}
}

// ParseArgs parses the arguments of `corral worker run-task` (those after
// "run-task") and the worker's environment:
//
//	--prompt /task/prompt.md --task-id ID [--webhook URL] [--agent NAME]
//	[--model M] [--agent-binary PATH] [--task-dir /task] [--source local]
//	[--max-log-bytes N] [--grace 10s] [--egress-socket PATH]
//	[--egress-listen 127.0.0.1:3128] [--egress-forward 127.0.0.1:PORT ...]
//	[-- argv...]
//
// The webhook key comes from CORRAL_WEBHOOK_KEY (hex) in environ. Every
// problem is returned at once, as errdefs.FieldErrors joined.
func ParseArgs(args []string, environ []string) (Options, error) {
	var o Options
	fs := flag.NewFlagSet("run-task", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.PromptPath, "prompt", "", "the prompt file, fed to the agent's stdin (default TASK_DIR/prompt.md)")
	fs.StringVar(&o.TaskID, "task-id", "", "the task's id")
	fs.StringVar(&o.WebhookURL, "webhook", "", "where to POST the completion: http(s)://host/path or unix:///path/to/socket")
	fs.StringVar(&o.Agent, "agent", "", "the agent: claude or command (default command when argv follows --, else claude)")
	fs.StringVar(&o.Model, "model", "", "the model to ask the agent for")
	fs.StringVar(&o.Binary, "agent-binary", "", "the agent's binary, if not its default name")
	fs.StringVar(&o.Resume, "resume", "", "the agent session to continue (claude)")
	fs.StringVar(&o.TaskDir, "task-dir", DefaultTaskDir, "the task directory")
	fs.StringVar(&o.Source, "source", "local", "the webhook's source: the runtime that ran the worker")
	fs.Int64Var(&o.MaxLogBytes, "max-log-bytes", DefaultMaxLogBytes, "the most bytes kept per log file")
	fs.DurationVar(&o.Grace, "grace", DefaultGrace, "how long the agent gets between SIGTERM and SIGKILL")
	fs.StringVar(&o.EgressSocket, "egress-socket", "", "the server's egress proxy socket; the agent reaches it through a relay on --egress-listen")
	fs.StringVar(&o.EgressListen, "egress-listen", "", "where the egress relay listens (default "+DefaultEgressListen+")")
	fs.Func("egress-forward", "a loopback host:port to forward, at the same address, through the egress proxy to the server's host (repeatable)", func(s string) error {
		o.EgressForward = append(o.EgressForward, s)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return Options{}, fmt.Errorf("parse run-task arguments: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	o.Command = fs.Args()
	o.Env = append([]string(nil), environ...)

	var errs []error
	if o.TaskID == "" {
		errs = append(errs, errdefs.Field("--task-id", "is required"))
	} else if strings.ContainsAny(o.TaskID, "/\x00") || o.TaskID == "." || o.TaskID == ".." {
		errs = append(errs, errdefs.Field("--task-id", "must not contain '/' or NUL"))
	}
	if o.Agent == "" && len(o.Command) > 0 {
		o.Agent = "command"
	}
	if o.Agent != "" {
		if _, err := agent.Lookup(o.Agent); err != nil {
			errs = append(errs, &errdefs.FieldError{Field: "--agent", Err: err})
		}
	}
	if o.Agent == "command" && len(o.Command) == 0 {
		errs = append(errs, errdefs.Field("--", "the command agent needs its argv after --"))
	}
	if o.MaxLogBytes <= 0 {
		errs = append(errs, errdefs.Field("--max-log-bytes", "must be positive"))
	}
	if o.Grace <= 0 {
		errs = append(errs, errdefs.Field("--grace", "must be positive"))
	}
	if o.EgressListen != "" {
		if _, _, err := net.SplitHostPort(o.EgressListen); err != nil {
			errs = append(errs, errdefs.Field("--egress-listen", "must be host:port"))
		}
	}
	listen := o.EgressListen
	if listen == "" {
		listen = DefaultEgressListen
	}
	for _, f := range o.EgressForward {
		if err := checkForward(f, listen); err != nil {
			errs = append(errs, &errdefs.FieldError{Field: "--egress-forward", Err: err})
		}
	}
	if len(o.EgressForward) > 0 && o.EgressSocket == "" {
		errs = append(errs, errdefs.Field("--egress-forward", "needs --egress-socket"))
	}
	if hexKey, ok := lookupEnv(environ, EnvWebhookKey); ok && hexKey != "" {
		key, err := hex.DecodeString(strings.TrimSpace(hexKey))
		if err != nil || len(key) < 16 {
			errs = append(errs, errdefs.Field(EnvWebhookKey, "must be at least 16 bytes, hex-encoded"))
		}
		o.WebhookKey = key
	}
	if o.WebhookURL != "" && len(o.WebhookKey) == 0 {
		errs = append(errs, errdefs.Field(EnvWebhookKey, "is required with --webhook"))
	}
	if len(errs) > 0 {
		return Options{}, errors.Join(errs...)
	}
	return o, nil
}

func lookupEnv(environ []string, key string) (string, bool) {
	for i := len(environ) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(environ[i], key+"="); ok {
			return v, true
		}
	}
	return "", false
}

// agentEnv is environ without CORRAL_* variables, then extra.
func agentEnv(environ, extra []string) []string {
	out := make([]string, 0, len(environ)+len(extra))
	for _, kv := range environ {
		if !strings.HasPrefix(kv, "CORRAL_") {
			out = append(out, kv)
		}
	}
	return append(out, extra...)
}

// discard is a logger for a nil *slog.Logger.
var discard = slog.New(slog.DiscardHandler)

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
