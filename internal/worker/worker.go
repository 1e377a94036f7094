// Package worker is the in-sandbox entrypoint, `corral worker run-task`
// (SPEC §6): it runs one task's agent in the task directory, keeps its
// transcript under logs/, writes status.json atomically and POSTs the
// signed completion webhook to the server.
//
// The sequence of Run:
//
//	with --egress-socket or --egress-addr: start the relay on 127.0.0.1:3128 (Relay), set the proxy variables
//	start the agent (own process group, prompt on stdin, env without CORRAL_*)
//	  → on SIGTERM, SIGINT or ctx done: SIGTERM the group, SIGKILL it after Grace
//	agent exits → SIGTERM what is left of its group, SIGKILL it after Grace
//	stop the relay, list output/, write status.json, POST the webhook (retrying), return the exit code
//
// The worker holds the task's webhook key; the agent never sees it: not
// in its environment, nor through /proc in the worker's (the entrypoint
// calls HideFromAgent first).
package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"mime"
	"os"
	"os/exec"
	"os/signal"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/agent"
	"github.com/corral-dev/corral/internal/egress"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/webhook"
	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/corral-dev/corral/internal/workspace"
)

// Exit codes of the worker itself, when the agent did not run. They follow
// the shell's conventions.
const (
	ExitSetup         = 1   // the worker could not prepare the run
	ExitUsage         = 2   // bad options
	ExitCannotExecute = 126 // the agent binary exists but cannot run
	ExitNotFound      = 127 // the agent binary is not in the sandbox
)

const (
	// stderrTailBytes is how much of stderr goes into error_message.
	stderrTailBytes = 1 << 10
	// drainTimeout bounds the wait for the output pipes after the agent's
	// group was killed: a process that left the group could hold them open.
	drainTimeout = 2 * time.Second
)

// Run runs the task described by opts and returns the agent's exit code
// (0..255, 128+signal if it was killed; 0 only for a success), or one of
// the Exit* codes if it never ran. It handles SIGTERM and SIGINT itself for its duration. A
// failure to deliver the webhook is logged and does not change the result:
// the server also learns the outcome from the sandbox's exit.
func Run(ctx context.Context, opts Options, log *slog.Logger) int {
	if log == nil {
		log = discard
	}
	opts.defaults()
	log = log.With(logkey.TaskID, opts.TaskID)
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	st := workerproto.Status{StartedAt: opts.Now()}
	root, err := os.OpenRoot(opts.TaskDir)
	if err != nil {
		log.Error("cannot open task directory", "dir", opts.TaskDir, logkey.Error, err)
		finish(&st, opts, ExitSetup, fmt.Sprintf("open task directory %s: %v", opts.TaskDir, err))
		deliver(ctx, opts, st, nil, log)
		return st.ExitCode
	}
	defer root.Close()

	r := &run{opts: opts, root: root, log: log}
	st = r.run(ctx)
	data, err := json.MarshalIndent(st, "", "  ")
	if err == nil {
		err = workspace.WriteFileAtomicNoSync(root, workerproto.StatusFile, append(data, '\n'), 0o644)
	}
	if err != nil {
		log.Error("cannot write status file", logkey.Error, err)
	}
	// A progress report in flight while status.json was written goes
	// before the completion, and what no report took goes with it.
	var progress []webhook.ProgressItem
	if r.finishProgress != nil {
		progress = r.finishProgress()
	}
	log.Info("task finished", logkey.Status, st.Status, "exit_code", st.ExitCode, "duration_seconds", st.DurationSeconds, "output_files", len(st.OutputFiles))
	deliver(ctx, opts, st, progress, log)
	return workerExit(st)
}

// workerExit is what the worker exits with: the agent's exit code, except
// that a run judged failed never exits 0 (ExitSetup then), so the sandbox's
// exit alone tells a success from a failure when status.json could not be
// written and no completion was recorded (a full disk).
func workerExit(st workerproto.Status) int {
	if st.ExitCode == 0 && st.Status != "success" {
		return ExitSetup
	}
	return st.ExitCode
}

// finish fills the end of st for a run that failed with msg.
func finish(st *workerproto.Status, opts Options, code int, msg string) {
	end := opts.Now()
	st.CompletedAt = end
	st.DurationSeconds, st.DurationMS = durations(end.Sub(st.StartedAt))
	st.ExitCode = code
	st.Status = "failed"
	st.ErrorMessage = msg
	st.StartedAt = st.StartedAt.UTC().Truncate(time.Second)
	st.CompletedAt = st.CompletedAt.UTC().Truncate(time.Second)
}

// durations are d in whole seconds (rounded) and in milliseconds.
func durations(d time.Duration) (int64, int64) {
	return int64(math.Round(d.Seconds())), d.Milliseconds()
}

// deliver POSTs st as the completion webhook, with the progress no report
// took, if a URL is set. After a stop signal it gets Grace to try, since
// the sandbox is going away.
func deliver(ctx context.Context, opts Options, st workerproto.Status, progress []webhook.ProgressItem, log *slog.Logger) {
	if opts.WebhookURL == "" {
		return
	}
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), opts.Grace)
		defer cancel()
	}
	names := make([]string, len(st.OutputFiles))
	for i, f := range st.OutputFiles {
		names[i] = f.Name
	}
	c := webhook.Completion{
		Source:          opts.Source,
		TaskID:          opts.TaskID,
		Status:          st.Status,
		DurationSeconds: float64(st.DurationMS) / 1000,
		ExitCode:        st.ExitCode,
		OutputFiles:     names,
		ErrorMessage:    st.ErrorMessage,
		SessionID:       st.SessionID,
		Progress:        progress,
	}
	po := opts.Webhook
	po.Source = opts.Source
	if po.Log == nil {
		po.Log = log
	}
	err := webhook.Post(ctx, opts.WebhookURL, opts.WebhookKey, c, po)
	switch {
	case err == nil:
		log.Info("webhook delivered")
	case errors.Is(err, errdefs.ErrConflict):
		log.Info("webhook already delivered", logkey.Error, err)
	default:
		log.Warn("webhook not delivered", logkey.Error, err)
	}
}

// run is one agent run.
type run struct {
	opts Options
	root *os.Root
	log  *slog.Logger
	// finishProgress stops progress reports, if they are sent, and returns
	// what none took: Run calls it before the completion webhook.
	finishProgress func() []webhook.ProgressItem
}

// postProgress sends one progress report with the task's key.
func (r *run) postProgress(ctx context.Context, items []webhook.ProgressItem) error {
	po := r.opts.Webhook
	po.Source = r.opts.Source
	po.AttemptTimeout = progressTimeout
	return webhook.PostProgress(ctx, r.opts.WebhookURL, r.opts.WebhookKey, webhook.ProgressReport{TaskID: r.opts.TaskID, Items: items}, po)
}

// missingDefaults are the defaults whose names environ does not set.
func missingDefaults(environ, defaults []string) []string {
	var out []string
	for _, kv := range defaults {
		name, _, _ := strings.Cut(kv, "=")
		if _, ok := lookupEnv(environ, name); !ok {
			out = append(out, kv)
		}
	}
	return out
}

func (r *run) run(ctx context.Context) workerproto.Status {
	st := workerproto.Status{StartedAt: r.opts.Now()}
	fail := func(code int, msg string) workerproto.Status {
		finish(&st, r.opts, code, msg)
		return st
	}

	adapter, err := agent.Lookup(r.opts.Agent)
	if err != nil {
		return fail(ExitUsage, err.Error())
	}
	inv := agent.Invocation{
		PromptPath: r.opts.PromptPath,
		Model:      r.opts.Model,
		Command:    r.opts.Command,
		Binary:     r.opts.Binary,
		ExtraArgs:  r.opts.AgentArgs,
		Resume:     r.opts.Resume,
		Continue:   r.opts.Continue,
	}
	if r.opts.Agent != "command" {
		// A HOME inside the task directory keeps what the agent stores
		// there (Claude Code's sessions) for a follow-up task.
		if err := r.root.MkdirAll(workerproto.HomeDir, 0o700); err != nil {
			return fail(ExitSetup, fmt.Sprintf("create agent home: %v", err))
		}
		inv.Home = strings.TrimRight(r.opts.TaskDir, "/") + "/" + workerproto.HomeDir
	}
	if r.opts.SessionID != "" {
		path, err := writeSessionMCP(r.opts.SessionID, r.opts.SessionToken)
		if err != nil {
			return fail(ExitSetup, err.Error())
		}
		defer os.Remove(path)
		inv.SessionMCP = path
	}
	proc, err := adapter.Prepare(inv)
	if err != nil {
		return fail(ExitUsage, err.Error())
	}

	var stdin io.Reader = strings.NewReader(proc.Stdin)
	if proc.StdinPath != "" {
		f, err := os.Open(proc.StdinPath)
		if err != nil {
			return fail(ExitSetup, fmt.Sprintf("open prompt: %v", err))
		}
		defer f.Close()
		stdin = f
	}

	if err := r.root.MkdirAll("logs", 0o755); err != nil {
		return fail(ExitSetup, fmt.Sprintf("create logs directory: %v", err))
	}
	stdoutLog, err := r.openLog(proc.Transcript)
	if err != nil {
		return fail(ExitSetup, err.Error())
	}
	defer stdoutLog.Close()
	stderrLog, err := r.openLog("stderr.log")
	if err != nil {
		return fail(ExitSetup, err.Error())
	}
	defer stderrLog.Close()

	stderrTail := &tail{max: 4 * stderrTailBytes}

	// The relay starts before the agent and stops after it: the sandbox has
	// loopback only, and the relay is its one way to the egress proxy.
	var proxyEnv, modelEnv []string
	if up := r.upstream(); up != nil {
		relay, err := StartRelay(r.opts.EgressListen, up, r.log)
		if err != nil {
			return fail(ExitSetup, err.Error())
		}
		defer relay.Close()
		proxyEnv = ProxyEnv(relay.Addr())
		if len(r.opts.EgressCA) > 0 {
			trust, err := TrustEgressCA(os.TempDir(), r.opts.EgressCA)
			if err != nil {
				return fail(ExitSetup, err.Error())
			}
			proxyEnv = append(proxyEnv, trust...)
		}
		for _, addr := range r.opts.EgressForward {
			fwd, err := StartForward(addr, up, r.log)
			if err != nil {
				return fail(ExitSetup, err.Error())
			}
			defer fwd.Close()
		}
		// The model APIs: the agent's base URL variables point at relays
		// here, through which the proxy adds the keys (last, so they win).
		for i, name := range r.opts.EgressModels {
			m, err := StartForwardTo("127.0.0.1:0", egress.ModelHost(i)+":80", up, r.log)
			if err != nil {
				return fail(ExitSetup, err.Error())
			}
			defer m.Close()
			modelEnv = append(modelEnv, name+"=http://"+m.Addr())
		}
	}
	proc.Env = append(append(proxyEnv, proc.Env...), modelEnv...)
	proc.Env = append(missingDefaults(r.opts.Env, proc.DefaultEnv), proc.Env...)

	// Secrets the agent holds (its API keys) never reach the transcript,
	// the summary, the error message or a progress report, even if the
	// agent prints them.
	secrets := workerproto.Secrets(agentEnv(r.opts.Env, proc.Env))
	if r.opts.SessionToken != "" {
		secrets = append([]string{r.opts.SessionToken}, secrets...)
	}
	onProgress := r.opts.OnProgress
	if onProgress == nil {
		onProgress = func(p agent.Progress) {
			if p.Kind == agent.ProgressToolUse {
				r.log.Debug("agent tool use", "tool", p.Tool)
			}
		}
	}
	if r.opts.WebhookURL != "" && len(r.opts.WebhookKey) > 0 && !r.opts.NoProgress {
		ps := newProgressSender(r.opts.ProgressInterval, func(s string) string { return workerproto.RedactString(s, secrets) }, r.postProgress, r.log)
		local := onProgress
		onProgress = func(p agent.Progress) {
			local(p)
			ps.add(p)
		}
		r.finishProgress = ps.finish
	}
	parser := adapter.NewParser(onProgress)
	stdout := newRedactor(io.MultiWriter(stdoutLog, parser), secrets)
	stderr := newRedactor(io.MultiWriter(stderrLog, stderrTail), secrets)
	// A workspace with git: what HEAD was, to report what the agent
	// changed. git runs here, in the sandbox, never on the host: the
	// repository's configuration is the agent's to write.
	gitStart := gitHead(r.opts.WorkDir)
	ReserveThreads()
	ex, err := r.start(proc, stdin, stdout, stderr)
	if err != nil {
		code, msg := startError(proc, r.opts.Image, err)
		return fail(code, msg)
	}
	r.log.Info("agent started", "agent", r.opts.Agent, "pid", ex.pid)
	code, sig, stopped := ex.wait(ctx, r.opts.Grace)
	if gitStart != "" {
		st.Changes = gitChanges(r.opts.WorkDir, gitStart)
	}
	stdout.Close()
	stderr.Close()
	res := parser.Result()
	end := r.opts.Now()
	r.log.Info("agent exited", "exit_code", code, "stopped", stopped)

	st.CompletedAt = end
	st.DurationSeconds, st.DurationMS = durations(end.Sub(st.StartedAt))
	st.StartedAt = st.StartedAt.UTC().Truncate(time.Second)
	st.CompletedAt = end.UTC().Truncate(time.Second)
	st.ExitCode = code
	st.OutputFiles = r.outputFiles()
	st.Summary = workerproto.RedactString(r.summary(proc, res), secrets)
	st.SessionID = res.SessionID
	st.CostUSD = res.CostUSD
	if res.Usage != (agent.Usage{}) {
		u := task.Usage(res.Usage)
		st.Usage = &u
	}
	for _, l := range []*boundedLog{stdoutLog, stderrLog} {
		if l.truncated {
			st.LogsTruncated = true
			r.log.Info("agent log truncated", "file", l.name, "bytes", l.total, "kept", l.written)
		}
		if l.err != nil {
			st.LogsTruncated = true
			r.log.Warn("agent log not fully written", "file", l.name, "kept", l.written, logkey.Error, l.err)
		}
	}
	if code == 0 && res.Error == "" && !stopped {
		st.Status = "success"
		return st
	}
	st.Status = "failed"
	var oomKills int64
	if sig == syscall.SIGKILL {
		oomKills = ownOOMKills()
	}
	st.ErrorMessage = workerproto.RedactString(errorMessage(code, sig, stopped, oomKills, res.Error, stderrTail.String()), secrets)
	return st
}

// upstream is how the relay reaches the server's egress proxy: its socket,
// or its listener across the network; nil: the task has no network.
func (r *run) upstream() Upstream {
	switch {
	case r.opts.EgressSocket != "":
		return SocketUpstream(r.opts.EgressSocket)
	case r.opts.EgressAddr != "":
		return TCPUpstream(r.opts.EgressAddr, r.opts.TaskID, r.opts.WebhookKey)
	}
	return nil
}

func (r *run) openLog(name string) (*boundedLog, error) {
	f, err := r.root.OpenFile(path.Join("logs", name), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log %s: %w", name, err)
	}
	return &boundedLog{name: name, f: f, max: r.opts.MaxLogBytes}, nil
}

// startError turns a failure to start the agent into an exit code and a
// message; image is the sandbox's image, "" for the host's /usr.
func startError(proc agent.Process, image string, err error) (int, string) {
	bin := proc.Args[0]
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		msg := fmt.Sprintf("agent binary %q not found in the sandbox", bin)
		if image != "" {
			msg = fmt.Sprintf("%s is not installed in image %s", bin, image)
		}
		if proc.InstallHint != "" {
			msg += " (install: " + proc.InstallHint + ")"
		}
		return ExitNotFound, msg
	}
	if errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.ENOEXEC) {
		return ExitCannotExecute, fmt.Sprintf("agent binary %q cannot be executed: %v", bin, err)
	}
	return ExitSetup, fmt.Sprintf("start agent %q: %v", bin, err)
}

// summary is the agent's summary file if it has one and it is there, else
// what the agent reported.
func (r *run) summary(proc agent.Process, res agent.Result) string {
	if proc.SummaryFile != "" {
		data, truncated, err := workspace.ReadFile(r.root, proc.SummaryFile, agent.MaxSummaryBytes)
		if err == nil && strings.TrimSpace(string(data)) != "" {
			s := strings.TrimSpace(string(data))
			if truncated {
				s = agent.Truncate(s, agent.MaxSummaryBytes-len("…")) + "…"
			}
			return s
		}
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			r.log.Warn("summary file not read", "file", proc.SummaryFile, logkey.Error, err)
		}
	}
	return res.Summary
}

// outputFiles lists the regular files beneath output/, never following a
// symbolic link.
func (r *run) outputFiles() []workerproto.OutputFile {
	files, skipped, err := workspace.ListFiles(r.root, "output")
	if err != nil {
		if !errors.Is(err, errdefs.ErrNotFound) {
			r.log.Warn("output files not listed", logkey.Error, err)
		}
		return nil
	}
	for _, s := range skipped {
		r.log.Warn("output file skipped: not a regular file (symbolic links are never followed)", "file", s)
	}
	if len(files) > r.opts.MaxOutputFiles {
		r.log.Warn("output files not all listed", "files", len(files), "listed", r.opts.MaxOutputFiles)
		files = files[:r.opts.MaxOutputFiles]
	}
	out := make([]workerproto.OutputFile, len(files))
	for i, f := range files {
		typ := f.Type
		if mt, _, err := mime.ParseMediaType(typ); err == nil {
			typ = mt
		}
		out[i] = workerproto.OutputFile{Name: f.Name, Size: f.Size, Type: typ}
	}
	return out
}

// errorMessage is status.json's error_message for a failed run: the agent's
// own error if it reported one, else the exit code, the OOM kills of the
// sandbox's memory cgroup if the agent was killed with some counted, and
// the end of stderr.
func errorMessage(code int, sig syscall.Signal, stopped bool, oomKills int64, agentErr, stderr string) string {
	if agentErr != "" {
		return agentErr
	}
	var b strings.Builder
	if stopped {
		b.WriteString("stopped before the agent finished: ")
	}
	fmt.Fprintf(&b, "exit code %d", code)
	if sig != 0 {
		fmt.Fprintf(&b, " (signal: %s)", sig)
	}
	if oomKills > 0 {
		fmt.Fprintf(&b, ", out of memory: the sandbox's memory cgroup OOM-killed %d of its processes", oomKills)
	}
	if t := stderrSummary(stderr, stderrTailBytes); t != "" {
		b.WriteString(": ")
		b.WriteString(t)
	}
	return b.String()
}

// stderrSummary is the last n bytes of stderr's non-empty lines, joined on
// one line with " | ".
func stderrSummary(s string, n int) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	out := strings.Join(lines, " | ")
	if len(out) > n {
		cut := len(out) - n
		for cut < len(out) && !utf8.RuneStart(out[cut]) {
			cut++
		}
		out = "…" + out[cut:]
	}
	return out
}

// boundedLog writes up to max bytes to a log file and counts the rest. Write
// never fails, so that a full disk cannot stall the agent's pipe.
type boundedLog struct {
	name      string
	f         *os.File
	max       int64
	written   int64
	total     int64
	truncated bool
	err       error
}

func (l *boundedLog) Write(p []byte) (int, error) {
	l.total += int64(len(p))
	keep := p
	if room := l.max - l.written; int64(len(keep)) > room {
		keep = keep[:max(room, 0)]
		l.truncated = true
	}
	if len(keep) > 0 && l.err == nil {
		n, err := l.f.Write(keep)
		l.written += int64(n)
		l.err = err
	}
	return len(p), nil
}

func (l *boundedLog) Close() error { return l.f.Close() }

// tail keeps the last max bytes written to it.
type tail struct {
	max int
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tail) String() string { return string(t.buf) }

// execution is a started agent.
type execution struct {
	cmd    *exec.Cmd
	pid    int
	copies sync.WaitGroup
	pipes  []*os.File // read ends, closed to unblock the copies if need be
}

// start starts proc in the task directory, in a process group of its own,
// copying its stdout and stderr to the writers.
func (r *run) start(proc agent.Process, stdin io.Reader, stdout, stderr io.Writer) (*execution, error) {
	cmd := exec.Command(proc.Args[0], proc.Args[1:]...)
	if cmd.Err != nil {
		return nil, cmd.Err
	}
	cmd.Dir = r.opts.TaskDir
	if r.opts.WorkDir != "" {
		cmd.Dir = r.opts.WorkDir
	}
	cmd.Env = agentEnv(r.opts.Env, proc.Env)
	cmd.Stdin = stdin
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	ex := &execution{cmd: cmd}
	var writeEnds []*os.File
	for _, w := range []struct {
		dst  io.Writer
		into *io.Writer
	}{{stdout, &cmd.Stdout}, {stderr, &cmd.Stderr}} {
		pr, pw, err := os.Pipe()
		if err != nil {
			closeAll(ex.pipes)
			closeAll(writeEnds)
			return nil, err
		}
		ex.pipes = append(ex.pipes, pr)
		writeEnds = append(writeEnds, pw)
		*w.into = pw
	}
	err := cmd.Start()
	closeAll(writeEnds) // the agent holds its own copies now
	if err != nil {
		closeAll(ex.pipes)
		return nil, err
	}
	ex.pid = cmd.Process.Pid
	for i, dst := range []io.Writer{stdout, stderr} {
		ex.copies.Add(1)
		go func() {
			defer ex.copies.Done()
			io.Copy(dst, ex.pipes[i])
		}()
	}
	return ex, nil
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// wait waits for the agent to exit, stopping its group when ctx ends, then
// ends what is left of the group and drains its output. It returns the exit
// code (128+signal if killed), the signal, and whether ctx ended first.
func (ex *execution) wait(ctx context.Context, grace time.Duration) (code int, sig syscall.Signal, stopped bool) {
	var stoppedFlag atomic.Bool
	exited := make(chan struct{})
	watcherDone := make(chan struct{})
	go func() {
		defer close(watcherDone)
		select {
		case <-exited:
			return
		case <-ctx.Done():
		}
		select {
		case <-exited:
			return // it ended on its own just as we were told to stop
		default:
		}
		stoppedFlag.Store(true)
		ex.signalGroup(syscall.SIGTERM)
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-exited:
		case <-t.C:
			ex.signalGroup(syscall.SIGKILL)
		}
	}()
	err := ex.cmd.Wait()
	close(exited)
	<-watcherDone

	// The leader is gone; its group may not be (a backgrounded child). End
	// it the same way, then collect the output it wrote.
	ex.signalGroup(syscall.SIGTERM)
	drained := make(chan struct{})
	go func() { ex.copies.Wait(); close(drained) }()
	t := time.NewTimer(grace)
	select {
	case <-drained:
	case <-t.C:
	}
	t.Stop()
	ex.signalGroup(syscall.SIGKILL)
	select {
	case <-drained:
	case <-time.After(drainTimeout):
		closeAll(ex.pipes) // a process outside the group holds the pipes
		<-drained
	}
	closeAll(ex.pipes)

	code, sig = exitCode(ex.cmd.ProcessState, err)
	return code, sig, stoppedFlag.Load()
}

// signalGroup sends sig to every process in the agent's group. The group
// id is the leader's pid, reserved while any member lives.
func (ex *execution) signalGroup(sig syscall.Signal) {
	syscall.Kill(-ex.pid, sig)
}

func exitCode(ps *os.ProcessState, err error) (int, syscall.Signal) {
	if ps == nil {
		return ExitSetup, 0
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), ws.Signal()
	}
	code := ps.ExitCode()
	if code < 0 || code > 255 {
		return ExitSetup, 0
	}
	return code, 0
}

// writeSessionMCP writes the MCP configuration of an agent that runs its
// commands in session id: one server, `corral mcp --session`, which offers
// workspace_exec bound to the session and reaches the server over the
// unix socket with the session's token. The file is private (0600, in the
// sandbox's own /tmp) and removed when the agent ends.
func writeSessionMCP(id, token string) (string, error) {
	cfg := map[string]any{"mcpServers": map[string]any{"corral": map[string]any{
		"command": workerproto.CorralBinary,
		"args":    []string{"mcp", "--server", "unix://" + workerproto.SocketDir + "/" + workerproto.SocketName, "--session", id},
		"env":     map[string]string{"CORRAL_API_TOKEN": token},
	}}}
	b, err := json.Marshal(cfg)
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp("", "corral-mcp-*.json")
	if err != nil {
		return "", fmt.Errorf("write the session's MCP configuration: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(f.Name())
		return "", fmt.Errorf("write the session's MCP configuration: %w", err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("write the session's MCP configuration: %w", err)
	}
	return f.Name(), nil
}
