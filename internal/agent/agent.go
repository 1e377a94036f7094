// Package agent holds the adapters that turn a task into an agent's command
// line (argv, environment, stdin) and read the agent's standard output back
// into progress items and a final result (SPEC §5). It starts no processes:
// the worker does, with what an adapter prepared.
package agent

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Invocation is what to run: the task's prompt and the agent's settings.
type Invocation struct {
	Prompt     string   // the prompt text, used as stdin when PromptPath is empty
	PromptPath string   // a file whose content is the prompt (stdin)
	Model      string   // the model to ask for, if the agent takes one
	Command    []string // argv of the command agent
	Binary     string   // overrides the agent's default binary name
	ExtraArgs  []string // appended to the agent's arguments
	Env        []string // KEY=value added to the agent's environment
	// Home, if set, is the agent's HOME: a directory beneath the task
	// directory, so what the agent keeps there (sessions) outlives the run.
	Home string
	// Resume is a session of an earlier run to continue, for agents that
	// can (claude --resume).
	Resume string
	// SystemPrompt, if set, is appended to the agent's system prompt where
	// the agent takes one.
	SystemPrompt string
	// Continue continues the agent's last conversation in its working
	// directory, for agents that can (claude --continue).
	Continue bool
	// SessionMCP, if set, is an MCP configuration file whose one server
	// offers workspace_exec: the agent's own shell tool is turned off and
	// its commands run through that tool. Only claude supports it; the
	// others refuse.
	SessionMCP string
}

// Process is how to start an agent for one Invocation.
type Process struct {
	Args []string // argv; Args[0] is looked up on PATH
	Env  []string // KEY=value added to the worker's environment
	// DefaultEnv are KEY=value settings used only where the environment
	// (the worker's, with the agent's configured env) has no KEY.
	DefaultEnv []string
	// StdinPath, if set, is a file fed to stdin; otherwise Stdin is.
	StdinPath string
	Stdin     string
	// Transcript is the file name under logs/ for stdout: "agent.jsonl"
	// for agents that print JSON lines, "stdout.log" for plain text.
	Transcript string
	// SummaryFile, if set, is a file beneath the task directory that, when
	// present, is the summary in place of Result.Summary.
	SummaryFile string
	// InstallHint says how to install the binary when it is missing.
	InstallHint string
}

// Adapter prepares one kind of agent. Implementations are stateless and
// safe for concurrent use.
type Adapter interface {
	// Prepare returns the process for inv. A bad invocation (no command for
	// the command agent) returns an error wrapping errdefs.ErrInvalidArgument.
	Prepare(inv Invocation) (Process, error)
	// NewParser returns a parser for one run's stdout. onProgress, if not
	// nil, is called from the parser's Write for each progress item.
	NewParser(onProgress func(Progress)) Parser
	// Credentials says what the agent authenticates with. The sandbox's
	// HOME is fresh, so a CLI's own login is never there: only the
	// environment the task gets (agents.<name>.env) counts.
	Credentials() Credentials
}

// Credentials are the environment variables an agent authenticates with.
type Credentials struct {
	// AnyOf are variables of which one, set and not empty, is enough;
	// none means the agent needs no credentials.
	AnyOf []string
	// BaseURL is the variable that points the agent at another model
	// endpoint (a gateway, a local model server), if it has one.
	BaseURL string
	// Keys say how the API keys among AnyOf are sent (ModelAPIs).
	Keys []Key
}

// Parser reads one run of an agent. Write is fed the agent's stdout as it
// comes, in chunks of any size; Result is called once stdout has ended. A
// Parser is used by one goroutine at a time.
type Parser interface {
	io.Writer
	Result() Result
}

// Progress is one thing the agent did, for live display.
type Progress struct {
	Kind   string // ProgressInit, ProgressText, ProgressToolUse, ProgressToolResult, ProgressResult
	Text   string // assistant text, a tool's output or the result text, bounded
	Tool   string // tool name, for ProgressToolUse and ProgressToolResult
	Input  string // compact JSON of the tool's input, bounded
	Status string // "ok" or "error", for ProgressToolResult
}

// Progress kinds.
const (
	ProgressInit    = "init"
	ProgressText    = "text"
	ProgressToolUse = "tool_use"
	// ProgressToolResult is a tool call's outcome.
	ProgressToolResult = "tool_result"
	ProgressResult     = "result"
)

// Result is what a run reported about itself.
type Result struct {
	Summary   string // the agent's final answer, bounded
	Error     string // the agent's own one-line error, if it reported one
	SessionID string
	CostUSD   float64
	Turns     int
	Usage     Usage
	Done      bool // the agent printed its final result
}

// Usage counts a run's tokens, as the agent reported them.
type Usage struct {
	InputTokens         int64 `json:"input_tokens"`
	OutputTokens        int64 `json:"output_tokens"`
	CacheReadTokens     int64 `json:"cache_read_tokens,omitempty"`
	CacheCreationTokens int64 `json:"cache_creation_tokens,omitempty"`
}

// Total is every token counted.
func (u Usage) Total() int64 {
	return u.InputTokens + u.OutputTokens + u.CacheReadTokens + u.CacheCreationTokens
}

// Limits on what an adapter keeps.
const (
	MaxSummaryBytes  = 64 << 10 // a final answer kept in status.json
	MaxErrorBytes    = 1 << 10
	MaxProgressBytes = 1 << 10
	MaxInputBytes    = 256
	// maxLineBytes bounds one JSON line; longer lines (a huge tool result)
	// are skipped, not parsed.
	maxLineBytes = 4 << 20
)

// Lookup returns the adapter named name. An unknown name returns an error
// wrapping errdefs.ErrInvalidArgument.
func Lookup(name string) (Adapter, error) {
	switch name {
	case "command":
		return commandAdapter{}, nil
	case "claude":
		return claudeAdapter{}, nil
	case "gemini":
		return geminiAdapter{}, nil
	case "codex":
		return codexAdapter{}, nil
	case "opencode":
		return opencodeAdapter{}, nil
	default:
		return nil, fmt.Errorf("look up agent %q: unknown agent (want claude, gemini, codex, opencode or command): %w", name, errdefs.ErrInvalidArgument)
	}
}

// stdin sets p's stdin from inv.
func stdin(p *Process, inv Invocation) {
	if inv.PromptPath != "" {
		p.StdinPath = inv.PromptPath
	} else {
		p.Stdin = inv.Prompt
	}
}

// Truncate returns s cut to at most n bytes on a rune boundary, with "…"
// appended when it was cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	if cut < 0 {
		cut = 0
	}
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// truncateStart keeps the last n bytes of s, on a rune boundary.
func truncateStart(s string, n int) string {
	if len(s) <= n {
		return s
	}
	start := len(s) - n
	for start < len(s) && !utf8.RuneStart(s[start]) {
		start++
	}
	return s[start:]
}

// oneLine collapses whitespace runs, newlines included, into single spaces.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// noSession refuses an Invocation with SessionMCP for an agent that cannot
// turn its own shell off for an MCP tool.
func noSession(agent string, inv Invocation) error {
	if inv.SessionMCP == "" {
		return nil
	}
	return fmt.Errorf("the %s agent cannot run its commands in a session (claude can): %w", agent, errdefs.ErrInvalidArgument)
}
