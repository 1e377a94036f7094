package worker

import (
	"encoding/hex"
	"errors"
	"log/slog"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/agent"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/webhook"
	"github.com/corral-dev/corral/internal/workerproto"
)

// DefaultMaxOutputFiles is how many output files status.json lists by
// default.
const DefaultMaxOutputFiles = 1000

// Options configure one worker run: the arguments the server gave
// (workerproto.Args) and what the worker adds. ParseArgs builds them from
// the command line and the environment; tests fill them in.
type Options struct {
	workerproto.Args

	WebhookKey []byte // webhook.DeriveKey(secret, TaskID)
	// Image is the image the sandbox runs (CORRAL_IMAGE); "" for a sandbox
	// on the host's /usr.
	Image string
	// EgressCA is the egress proxy's CA certificate (CORRAL_EGRESS_CA,
	// DER), which the agent is made to trust; nil when there is none.
	EgressCA []byte
	// SessionID and SessionToken (CORRAL_SESSION_ID, CORRAL_SESSION_TOKEN)
	// are the session the agent runs its commands in, and a token of it.
	SessionID, SessionToken string
	// Webhook tunes delivery (retries, backoff, clock); Source and Log are
	// filled in from the fields above.
	Webhook webhook.PostOptions

	// Env is the worker's environment. The agent gets it without CORRAL_*
	// variables, plus what its adapter adds.
	Env []string

	MaxOutputFiles int // listed in status.json; default 1000

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
		o.TaskDir = workerproto.TaskDir
	}
	if o.PromptPath == "" {
		o.PromptPath = strings.TrimRight(o.TaskDir, "/") + "/" + workerproto.PromptFile
	}
	if o.Agent == "" {
		o.Agent = "claude"
		if len(o.Command) > 0 {
			o.Agent = "command"
		}
	}
	if o.Source == "" {
		o.Source = workerproto.DefaultSource
	}
	if o.EgressListen == "" {
		o.EgressListen = workerproto.DefaultEgressListen
	}
	if o.MaxLogBytes <= 0 {
		o.MaxLogBytes = workerproto.DefaultMaxLogBytes
	}
	if o.MaxOutputFiles <= 0 {
		o.MaxOutputFiles = DefaultMaxOutputFiles
	}
	if o.Grace <= 0 {
		o.Grace = workerproto.DefaultGrace
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = DefaultProgressInterval
	}
}

// ParseArgs parses the arguments of `corral worker run-task` (those after
// "run-task", workerproto.ParseArgs) and the worker's environment, whose
// CORRAL_WEBHOOK_KEY (hex) is the webhook key. Every problem is returned
// at once, as errdefs.FieldErrors joined.
func ParseArgs(args []string, environ []string) (Options, error) {
	a, err := workerproto.ParseArgs(args)
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	o := Options{Args: a, Env: append([]string(nil), environ...)}
	// A unix:// webhook is a replica's socket, and the host's shared one
	// when that replica is gone.
	o.Webhook.Dial = workerproto.DialServer
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
	if hexKey, ok := lookupEnv(environ, workerproto.EnvWebhookKey); ok && hexKey != "" {
		key, err := hex.DecodeString(strings.TrimSpace(hexKey))
		if err != nil || len(key) < 16 {
			errs = append(errs, errdefs.Field(workerproto.EnvWebhookKey, "must be at least 16 bytes, hex-encoded"))
		}
		o.WebhookKey = key
	}
	o.Image, _ = lookupEnv(environ, workerproto.EnvImage)
	if ca, _ := lookupEnv(environ, workerproto.EnvEgressCA); ca != "" {
		if o.EgressCA, err = ParseEgressCA(ca); err != nil {
			errs = append(errs, &errdefs.FieldError{Field: workerproto.EnvEgressCA, Err: err})
		}
	}
	o.SessionID, _ = lookupEnv(environ, workerproto.EnvSessionID)
	o.SessionToken, _ = lookupEnv(environ, workerproto.EnvSessionToken)
	if (o.SessionID == "") != (o.SessionToken == "") {
		errs = append(errs, errdefs.Field(workerproto.EnvSessionID, "and "+workerproto.EnvSessionToken+" go together"))
	}
	if o.WebhookURL != "" && len(o.WebhookKey) == 0 {
		errs = append(errs, errdefs.Field(workerproto.EnvWebhookKey, "is required with --webhook"))
	}
	if o.EgressAddr != "" && len(o.WebhookKey) == 0 {
		errs = append(errs, errdefs.Field(workerproto.EnvWebhookKey, "is required with --egress-addr"))
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
		if !strings.HasPrefix(kv, workerproto.EnvPrefix) {
			out = append(out, kv)
		}
	}
	return append(out, extra...)
}

// discard is a logger for a nil *slog.Logger.
var discard = slog.New(slog.DiscardHandler)
