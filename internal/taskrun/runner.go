package taskrun

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/placement"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/units"
	"github.com/corral-dev/corral/internal/webhook"
	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/corral-dev/corral/internal/workspace"
)

const (
	// maxStatusBytes bounds the status.json the server reads from a worker.
	maxStatusBytes = 1 << 20
	// maxMessage bounds a summary or error message taken from a worker.
	maxMessage = 8 << 10
	// maxOutputFiles and maxOutputNameBytes bound the output_files a result
	// lists (the count, and the bytes of the names): a worker may leave
	// 100,000 files, and the result goes to a host's model.
	maxOutputFiles     = 1000
	maxOutputNameBytes = 64 << 10
)

// WorkerOptions say how a sandbox starts `corral worker run-task`.
type WorkerOptions struct {
	// BinDir is the host directory holding the corral and corral-worker
	// executables (workerproto.CorralName, WorkerName), each mounted
	// read-only.
	BinDir string
	// SocketDir is the host directory holding the servers' unix sockets,
	// mounted whole: each replica's in a directory of its own, and the
	// host's shared one (workerproto.ServerSocket).
	SocketDir string
	// Replica is this server's id in its cluster: its workers post to its
	// own socket, and to the shared one once it is gone.
	Replica string
	// Secret is the server's webhook secret; each task gets a key derived
	// from it.
	Secret []byte
	// Env is extra environment for every worker (PATH, LANG, ...).
	Env []string
	// Placements are the runtimes' records: for a remote one
	// (kubernetes), the URL its workers reach the server at (its
	// Service), where their webhooks go over the network, signed as ever,
	// with no unix socket mounted, and where they reach the egress
	// proxies (host:port; egress.Server.ServeTCP), without which its
	// tasks run with network none only. Nil: none is remote.
	Placements *placement.Set
}

// Verifier checks a completion webhook's signature, freshness and
// uniqueness.
type Verifier interface {
	Verify(m webhook.Signed) (webhook.Completion, error)
	VerifyProgress(m webhook.Signed) (webhook.ProgressReport, error)
	Forget(webhookID string)
}

// Prepare builds the sandbox spec for a starting task: the worker entrypoint
// with the task's agent, its mounts, environment and limits. A task whose
// spec cannot be built has no egress proxy left open for it.
func (o *Runner) Prepare(ctx context.Context, t task.Task) (sandbox.Spec, error) {
	spec, err := o.prepare(ctx, t)
	if err != nil && o.opts.Egress != nil && t.Network != "" && t.Network != task.NetworkNone {
		o.closeEgress(t.ID) // no sandbox will use it; a start again opens it again
	}
	return spec, err
}

func (o *Runner) prepare(ctx context.Context, t task.Task) (sandbox.Spec, error) {
	if err := o.checkPrompt(t); err != nil {
		return sandbox.Spec{}, err
	}
	w := o.opts.Worker
	ag := o.opts.Agents[t.Agent]
	args := workerproto.Args{
		PromptPath:  workerproto.TaskDir + "/" + workerproto.PromptFile,
		TaskID:      t.ID,
		WebhookURL:  "unix://" + workerproto.ServerSocket(w.Replica),
		Agent:       t.Agent,
		Model:       t.Model,
		MaxLogBytes: o.opts.MaxLogBytes,
	}
	if task.KnownAgent(t.Model) {
		// The seed's model: which agent, not a model for it.
		args.Model = ""
	}
	var where placement.Runtime
	if p, ok := w.Placements.Get(t.Runtime); ok {
		where = *p
	}
	remote := where.Remote
	if remote {
		args.WebhookURL = strings.TrimSuffix(where.ServerURL, "/") + webhook.Path
		if t.ExecSession != "" {
			return sandbox.Spec{}, fmt.Errorf("task %s: a task on the %s runtime cannot work through a session (its agent would reach the session over this server's unix socket, which a pod has not): %w", t.ID, t.Runtime, errdefs.ErrFailedPrecondition)
		}
	}
	if t.Agent != task.AgentCommand { // a command task's argv is its own
		args.Binary, args.AgentArgs = ag.Binary, ag.Args
	}
	var project workspace.Project
	if t.Workspace != "" {
		// Checked again: a directory under a workspace root may have
		// been replaced (by a link, say) since the spawn.
		pr, err := o.opts.Projects.Resolve(t.Workspace)
		if err != nil {
			return sandbox.Spec{}, fmt.Errorf("task %s: %w", t.ID, err)
		}
		if err := o.opts.Projects.Check(pr); err != nil {
			return sandbox.Spec{}, fmt.Errorf("task %s: %w", t.ID, err)
		}
		project = pr
		if err := o.snapshotGit(t, pr); err != nil {
			return sandbox.Spec{}, fmt.Errorf("task %s: %w", t.ID, err)
		}
		args.WorkDir = workerproto.ProjectDir
		// Claude Code keeps a conversation per working directory under its
		// HOME, the workspace's: the next task there continues it.
		if t.Agent == task.AgentClaude {
			if fi, err := o.data.Root().Stat(workspaceHome(project) + "/.claude/projects/" + claudeProjectKey(workerproto.ProjectDir)); err == nil && fi.IsDir() {
				args.Continue = true
			}
		}
	}
	if t.FollowUpOf != "" && t.Agent == task.AgentClaude {
		if prev, err := o.tasks.Get(t.FollowUpOf); err == nil && prev.SessionID != "" && prev.Agent == t.Agent {
			args.Resume = prev.SessionID
		}
	}
	network := sandbox.NetworkNone
	var egressDir string
	var egressEnv []string
	if t.Network != "" && t.Network != task.NetworkNone {
		if remote && where.EgressAddr == "" {
			return sandbox.Spec{}, fmt.Errorf("network %s on the %s runtime: %s; run it with network none: %w", t.Network, t.Runtime, where.NoEgress, errdefs.ErrFailedPrecondition)
		}
		if o.opts.Egress == nil {
			return sandbox.Spec{}, fmt.Errorf("network %s needs the egress proxy, which this server does not run: %w", t.Network, errdefs.ErrFailedPrecondition)
		}
		// The agent's API keys stay here: its sandbox gets placeholders,
		// and its egress adds the keys to the requests for its model APIs.
		dir, err := o.openEgress(t)
		if err != nil {
			return sandbox.Spec{}, fmt.Errorf("open egress proxy: %w", err)
		}
		network, args.EgressForward = sandbox.NetworkEgress, o.opts.Egress.Forwards()
		egressEnv = o.opts.Egress.SandboxEnv(o.egressPolicy(t))
		for _, m := range ag.Models {
			args.EgressModels = append(args.EgressModels, m.BaseURLVar)
		}
		if remote {
			// Over the network, with the task's key; nothing to mount.
			args.EgressAddr = where.EgressAddr
		} else {
			egressDir = dir
			args.EgressSocket = workerproto.EgressDir + "/" + workerproto.EgressSocket
		}
	}
	if t.Agent == task.AgentCommand {
		args.Command = t.Command
	}
	cmd := append([]string{workerproto.WorkerBinary}, args.Argv()...)
	env := append([]string{
		"HOME=/tmp",
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LANG=C.UTF-8",
		workerproto.EnvTaskID + "=" + t.ID,
		workerproto.EnvWebhookKey + "=" + hex.EncodeToString(webhook.DeriveKey(w.Secret, t.ID)),
	}, w.Env...)
	if t.Image != "" {
		env = append(env, workerproto.EnvImage+"="+t.Image)
	}
	env = append(env, egressEnv...)
	if t.ExecSession != "" {
		if o.opts.Sessions == nil {
			return sandbox.Spec{}, fmt.Errorf("task %s works through session %s, and sessions are not served here: %w", t.ID, t.ExecSession, errdefs.ErrFailedPrecondition)
		}
		token, err := o.opts.Sessions.Grant(ctx, t.ExecSession, t.ID)
		if err != nil {
			return sandbox.Spec{}, fmt.Errorf("task %s: its session: %w", t.ID, err)
		}
		env = append(env, workerproto.EnvSessionID+"="+t.ExecSession, workerproto.EnvSessionToken+"="+token)
	}
	env = append(env, ag.SandboxEnv...)
	mounts, err := o.baseMounts(t.ID, remote)
	if err != nil {
		return sandbox.Spec{}, err
	}
	if t.Workspace != "" {
		// The agent works in the project; its HOME (Claude Code's
		// conversations) is the workspace's own, so the next task there
		// continues the conversation.
		home := workspaceHome(project)
		if err := o.workspaceDirs(t.ID, home); err != nil {
			return sandbox.Spec{}, err
		}
		mounts = append(mounts,
			sandbox.Mount{Source: project.Source(), Target: workerproto.ProjectDir, HostDir: !project.InDataRoot()},
			sandbox.Mount{Source: home, Target: workerproto.TaskDir + "/" + workerproto.HomeDir})
	}
	if t.Kind == task.KindExec {
		// A code_execute call sees its inputs and outputs under
		// /workspace, beside shared/ (seed 004's layout).
		if err := o.execDirs(t.ID); err != nil {
			return sandbox.Spec{}, err
		}
		taskDir := workspace.DirTasks + "/" + t.ID
		mounts = append(mounts,
			sandbox.Mount{Source: taskDir + "/context", Target: workerproto.ExecInputDir, ReadOnly: true},
			sandbox.Mount{Source: taskDir + "/output", Target: workerproto.ExecOutputDir})
	}
	if egressDir != "" {
		m, err := o.egressMount(egressDir)
		if err != nil {
			return sandbox.Spec{}, err
		}
		mounts = append(mounts, m)
	}
	limits := limitsOf(t.Resources)
	limits.WallClock = t.Timeout()
	return sandbox.Spec{
		ID:      t.ID,
		Image:   t.Image,
		Command: cmd,
		Dir:     workerproto.TaskDir,
		Env:     env,
		Mounts:  mounts,
		Limits:  limits,
		Network: network,
		Labels:  map[string]string{sandbox.LabelManaged: "true", sandbox.LabelTaskID: t.ID},
	}, nil
}

// baseMounts are the mounts of every sandbox of task id: its directory,
// shared/, corral and corral-worker and, on this host (not remote), the server's
// socket directory. They name paths of the data root; each runtime
// decides how to expose them.
func (o *Runner) baseMounts(id string, remote bool) ([]sandbox.Mount, error) {
	w := o.opts.Worker
	bin, err := o.inDataRoot(w.BinDir)
	if err != nil {
		return nil, fmt.Errorf("the worker binary: %w", err)
	}
	sockets, err := o.inDataRoot(w.SocketDir)
	if err != nil {
		return nil, fmt.Errorf("the socket directory: %w", err)
	}
	own := sandbox.Mount{Source: workspace.DirTasks + "/" + id, Target: workerproto.TaskDir}
	return append([]sandbox.Mount{own}, placement.Base{BinDir: bin, SocketDir: sockets}.Mounts(remote)...), nil
}

// egressMount mounts the egress proxy's directory dir (a host path).
func (o *Runner) egressMount(dir string) (sandbox.Mount, error) {
	rel, err := o.inDataRoot(dir)
	if err != nil {
		return sandbox.Mount{}, fmt.Errorf("the egress proxy's directory: %w", err)
	}
	return placement.EgressMount(rel), nil
}

func limitsOf(r task.Resources) sandbox.Limits {
	return sandbox.Limits{MemoryBytes: r.MemoryBytes, CPUMillis: r.CPUMillis, Pids: r.Pids}
}

// WarmShapes are the sandboxes worth keeping warm on a runtime (where):
// those of a task with resources res (the defaults) outside any
// workspace, a code_execute call excepted (it mounts more), with network
// none and, when the server runs egress proxies (and where's pods reach
// them, for a remote runtime), with egress. Prepare's
// spec of such a task fits one (sandbox.WarmShape.Fits). Their main
// process is `corral-worker worker warm`, which runs the task's worker
// when the task comes. It starts with GOMAXPROCS at
// workerproto.WorkerProcs, as the Go runtime would size itself for the
// host's CPUs; the task's worker and agent get the task's environment.
func (o *Runner) WarmShapes(res task.Resources, where placement.Runtime) ([]sandbox.WarmShape, error) {
	mounts, err := o.baseMounts(sandbox.WarmTaskID, where.Remote)
	if err != nil {
		return nil, err
	}
	tmpl := sandbox.Spec{
		Command: []string{workerproto.WorkerBinary, "worker", "warm"},
		Dir:     workerproto.TaskDir,
		Env:     []string{"HOME=/tmp", "LANG=C.UTF-8", workerproto.MaxProcsEnv()},
		Mounts:  mounts,
		Limits:  limitsOf(res),
		Network: sandbox.NetworkNone,
	}
	shapes := []sandbox.WarmShape{{Name: string(sandbox.NetworkNone), Template: tmpl}}
	switch {
	case o.opts.Egress != nil && where.Remote && where.EgressAddr != "":
		// Over the network, with the task's key: nothing to mount.
		tmpl.Network = sandbox.NetworkEgress
		shapes = append(shapes, sandbox.WarmShape{Name: string(sandbox.NetworkEgress), Template: tmpl})
	case o.opts.Egress != nil && !where.Remote:
		m, err := o.egressMount(o.opts.Egress.Dir(sandbox.WarmTaskID))
		if err != nil {
			return nil, err
		}
		tmpl.Mounts = append(slices.Clone(mounts), m)
		tmpl.Network = sandbox.NetworkEgress
		shapes = append(shapes, sandbox.WarmShape{Name: string(sandbox.NetworkEgress), Template: tmpl})
	}
	return shapes, nil
}

// workspaceHome is the HOME of workspace pr's agents, in the data root.
func workspaceHome(pr workspace.Project) string { return workspace.DirRun + "/homes/" + pr.HomeKey() }

// workspaceDirs makes a workspace task's HOME in the data root (home) and
// its mount point in the task directory.
func (o *Runner) workspaceDirs(id, home string) error {
	if err := o.data.Root().MkdirAll(home, 0o755); err != nil {
		return fmt.Errorf("create the workspace's agent home: %w", err)
	}
	dir, err := o.data.OpenTask(id)
	if err != nil {
		return err
	}
	defer dir.Close()
	if err := dir.MkdirAll(workerproto.HomeDir, 0o700); err != nil {
		return fmt.Errorf("create %s of task %s: %w", workerproto.HomeDir, id, err)
	}
	return nil
}

// execDirs makes the input and output directories a code_execute call's
// sandbox mounts.
func (o *Runner) execDirs(id string) error {
	dir, err := o.data.OpenTask(id)
	if err != nil {
		return err
	}
	defer dir.Close()
	for _, d := range []string{"context", "output"} {
		if err := dir.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create %s of task %s: %w", d, id, err)
		}
	}
	return nil
}

// Collect reads a finished task's result from its directory: status.json
// as the worker wrote it, the output files as they are on disk (never the
// worker's own list), and the sandbox's exit status. exit is nil when the
// sandbox was gone after a restart.
func (o *Runner) Collect(ctx context.Context, t task.Task, exit *sandbox.ExitStatus) task.Completed {
	c := task.Completed{Status: task.Failed, Reason: "exit"}
	dir, err := o.data.OpenTask(t.ID)
	if err != nil {
		c.ErrorMessage = "task directory is gone: " + err.Error()
		return c
	}
	defer dir.Close()

	files, _, err := workspace.ListFiles(dir, "output")
	var all []task.OutputFile
	if err == nil {
		for _, f := range files {
			all = append(all, task.OutputFile{Name: f.Name, Size: f.Size, Type: f.Type})
		}
	}
	c.OutputFiles, c.OutputFilesTotal, c.OutputFilesNote = boundOutputFiles(all)
	st, stErr := workerproto.ReadStatus(dir, maxStatusBytes)
	// The worker redacts its agent's secrets; a task's sandbox is not
	// trusted to have done so, so what it reports is redacted here too.
	secrets := workerproto.Secrets(o.opts.Agents[t.Agent].Env)
	red := func(s string) string { return workerproto.RedactString(s, secrets) }
	// A sandbox that vanished (gone after a restart, or ended with no exit
	// status a runtime could read) is lost, not an exit.
	vanished := exit == nil || (exit.Code < 0 && !exit.OOMKilled)
	// A sandbox whose main process never had the task's command: its code
	// is not the command's.
	notStarted := exit != nil && exit.NotStarted
	if !vanished && !notStarted {
		code := exit.Code
		c.ExitCode = &code
	}
	switch {
	case stErr == nil:
		c.Status = task.Failed
		if st.Status == string(task.Success) {
			c.Status = task.Success
		}
		code := st.ExitCode
		c.ExitCode = &code
		c.Summary = message(st.Summary)
		c.ErrorMessage = message(st.ErrorMessage)
		c.LogsTruncated = st.LogsTruncated
		c.SessionID = red(message(st.SessionID))
		if t.Workspace != "" {
			c.Changes = boundChanges(st.Changes, red)
		}
		if st.Usage != nil && st.Usage.Total() >= 0 && st.Usage.InputTokens >= 0 && st.Usage.OutputTokens >= 0 {
			c.Usage = &task.Usage{InputTokens: st.Usage.InputTokens, OutputTokens: st.Usage.OutputTokens, CacheReadTokens: max(st.Usage.CacheReadTokens, 0), CacheCreationTokens: max(st.Usage.CacheCreationTokens, 0)}
		}
		if st.CostUSD > 0 && st.CostUSD < 1e6 {
			c.CostUSD = st.CostUSD
		}
		if d := float64(st.DurationMS) / 1000; d > 0 {
			c.DurationSeconds = &d
		}
		if vanished {
			c.Reason = "recovered"
		}
	case notStarted:
		c.Reason = "start"
		c.ErrorMessage = "the task's command never started: " + exit.Message
	case exit == nil:
		c.Reason = "lost"
		c.ErrorMessage = "lost: the task's sandbox was gone when its server restarted or another adopted the task, and it left no status.json"
	case vanished:
		c.Reason = "lost"
		c.ErrorMessage = "lost: the task's sandbox vanished without an exit status or status.json"
		if exit.Message != "" {
			c.ErrorMessage += " (" + exit.Message + ")"
		}
	case exit.OOMKilled:
		c.ErrorMessage = "out of memory: the sandbox reached its memory limit of " + units.FormatSize(t.Resources.MemoryBytes)
	case exit.Code == 0:
		// The worker exits 0 for a success alone: its status.json could
		// not be written (a full disk), but its result is known.
		c.Status = task.Success
		c.Summary = "(the worker succeeded, but could not write status.json: its summary is lost; was the disk full?)"
	default:
		c.ErrorMessage = fmt.Sprintf("the worker ended with exit code %d without writing status.json", exit.Code)
		if exit.Message != "" {
			c.ErrorMessage += " (" + exit.Message + ")"
		}
	}
	c.Summary, c.ErrorMessage = red(c.Summary), red(c.ErrorMessage)
	if exit != nil && exit.DeadlineExceeded && c.Status != task.Success {
		c.Status, c.Reason = task.Timeout, "timeout"
		c.ErrorMessage = fmt.Sprintf("timed out after %s (the runtime's deadline)", t.Timeout())
	}
	if exit != nil && exit.OOMKilled && c.Status != task.Success {
		c.ErrorMessage = "out of memory: the sandbox reached its memory limit of " + units.FormatSize(t.Resources.MemoryBytes)
	}
	if max := o.opts.MaxTaskDirBytes; max > 0 {
		if err := quotaError(dir, max); err != nil && c.Status == task.Timeout {
			// The deadline ended it; the quota is said beside.
			c.ErrorMessage += "; " + err.Error()
		} else if err != nil {
			c.Status = task.Failed
			c.ErrorMessage = err.Error()
		}
	}
	// save_to_shared's copy follows the end (library.RunSaves): the end,
	// and the sandbox's slot, never wait for it.
	return c
}

// Reported is Collect for a task whose worker has written its final
// status.json, and false for one that has not yet (scheduler
// Options.Reported).
func (o *Runner) Reported(ctx context.Context, t task.Task) (task.Completed, bool) {
	dir, err := o.data.OpenTask(t.ID)
	if err != nil {
		return task.Completed{}, false
	}
	_, err = workerproto.ReadStatus(dir, maxStatusBytes)
	dir.Close()
	if err != nil {
		return task.Completed{}, false
	}
	return o.Collect(ctx, t, nil), true
}

// boundOutputFiles returns the first of files within maxOutputFiles and
// maxOutputNameBytes; when some are left out, also how many files there
// are and a note saying where the rest are.
func boundOutputFiles(files []task.OutputFile) (listed []task.OutputFile, total int, note string) {
	size := 0
	for i, f := range files {
		size += len(f.Name)
		if i == maxOutputFiles || size > maxOutputNameBytes {
			return files[:i], len(files), fmt.Sprintf("%d of the %d output files are listed; all of them are in the task's output/ directory", i, len(files))
		}
	}
	return files, 0, ""
}

// maxStartWait bounds how long a worker's completion waits for its task to
// be recorded as started.
const maxStartWait = 10 * time.Second

// waitStarted waits until task id has left starting (or maxStartWait).
func (o *Runner) waitStarted(ctx context.Context, id string) (task.Task, error) {
	timer := time.NewTimer(maxStartWait)
	defer timer.Stop()
	for {
		changed := o.tasks.TaskChanged(id)
		t, err := o.tasks.Get(id)
		if err != nil || t.Status != task.Starting {
			return t, err
		}
		select {
		case <-changed:
		case <-timer.C:
			return t, fmt.Errorf("task %s is still starting after %s: %w", id, maxStartWait, errdefs.ErrUnavailable)
		case <-ctx.Done():
			return t, ctx.Err()
		}
	}
}

// message is a worker's text for an event: trimmed, at most maxMessage
// bytes.
func message(s string) string { return clip.String(strings.TrimSpace(s), maxMessage) }

// WorkerComplete takes a completion webhook from a worker: it verifies the
// signature with the task's derived key, the timestamp and the webhook id,
// then ends the task with the result it reads from the task directory.
// A completion for a task that already ended is accepted and changes
// nothing. It returns the id of the task's last event: the one it
// appended, if any, else the last the task had when it looked.
func (o *Runner) WorkerComplete(ctx context.Context, m webhook.Signed) (string, error) {
	c, err := o.opts.Verifier.Verify(m)
	if err != nil {
		return "", err
	}
	t, err := o.started(ctx, c.TaskID)
	if err != nil {
		o.opts.Verifier.Forget(c.WebhookID) // let the worker's retry through
		return "", err
	}
	// The progress no report took goes first, in the completion's commit
	// when the completion ends the task.
	progress := o.progressEvents(t, c.Progress)
	// A success ends the task at once. A failure is acknowledged but left
	// to the sandbox's exit, which follows within moments: the runtime knows
	// what the worker cannot (the memory limit killed the agent, a signal
	// came from outside), and the task's error should say so.
	if !t.Status.Terminal() && c.Status == string(task.Success) {
		res := o.Collect(ctx, t, &sandbox.ExitStatus{Code: c.ExitCode, ExitedAt: time.Now()})
		res.Reason = "webhook"
		actor := "worker/" + t.ID
		ended := false
		t, err = o.tasks.Update(ctx, t.ID, func(t task.Task) ([]eventstore.Proposed, error) {
			ended = !t.Status.Terminal()
			switch {
			case ended:
				return append(progress, projection.NewEvent(task.EventCompleted, res, actor)), nil
			case len(progress) > 0:
				return progress, nil // the exit ended it first
			}
			return nil, projection.ErrNoChange
		})
		if err != nil {
			o.opts.Verifier.Forget(c.WebhookID) // let the worker's retry through
			return "", err
		}
		if ended {
			o.log.Info("task completed by webhook", "task_id", t.ID, "status", t.Status)
		}
	} else if len(progress) > 0 {
		evs, err := o.store.Append(projection.TaskCause(ctx, t), task.StreamID(t.ID), eventstore.AnyVersion, progress...)
		if err != nil {
			o.opts.Verifier.Forget(c.WebhookID)
			return "", fmt.Errorf("record progress of task %s: %w", t.ID, err)
		}
		return evs[len(evs)-1].ID, nil
	}
	return t.LastEventID, nil
}

// started returns task id once it has started: a report for a task not
// started is refused, and one for a task starting waits for its start to
// be recorded (a fast worker can report before the scheduler records its
// sandbox as started), so the task's log reads starting, started, then
// what the worker reported.
func (o *Runner) started(ctx context.Context, id string) (task.Task, error) {
	t, err := o.tasks.Get(id)
	if err != nil {
		return task.Task{}, err
	}
	switch t.Status {
	case task.Pending, task.Queued:
		return task.Task{}, fmt.Errorf("task %s has not started: %w", t.ID, errdefs.ErrFailedPrecondition)
	case task.Starting:
		return o.waitStarted(ctx, t.ID)
	}
	return t, nil
}

// checkPrompt refuses a task whose prompt.md is not the one written at its
// spawn. The file reaches the disk beside the task's first events, not
// before them, so a crash (a power loss) in between can leave a task whose
// prompt.md is missing, empty or torn: it must not run on what is left.
func (o *Runner) checkPrompt(t task.Task) error {
	if t.PromptSHA256 == "" {
		return nil // created before the hash was recorded
	}
	dir, err := o.data.OpenTask(t.ID)
	if err != nil {
		return err
	}
	defer dir.Close()
	b, err := dir.ReadFile(workerproto.PromptFile)
	if err == nil {
		sum := sha256.Sum256(b)
		if hex.EncodeToString(sum[:]) == t.PromptSHA256 {
			return nil
		}
		err = errors.New("its content is not what was written")
	}
	return fmt.Errorf("task %s: its %s did not survive (a crash before it reached the disk?): %v; spawn the task again: %w", t.ID, workerproto.PromptFile, err, errdefs.ErrFailedPrecondition)
}

// Reconcile is the runner's part of start-up reconciliation, which the
// scheduler does first: it reports task directories that no event knows,
// as system events (SPEC §3), never deleting them (a person decides).
// (The egress proxies of the tasks still running reopen as the scheduler
// adopts them: Adopt.)
func (o *Runner) Reconcile(ctx context.Context) error {
	return o.reconcileDirectories(ctx)
}

func (o *Runner) reconcileDirectories(ctx context.Context) error {
	ids, err := o.data.TaskIDs()
	if err != nil {
		return fmt.Errorf("list task directories: %w", err)
	}
	// Other servers on the store may have made a task since this one's
	// projection was built.
	if err := o.tasks.Sync(ctx); err != nil {
		return err
	}
	for _, id := range ids {
		if _, _, ok := o.tasks.Status(id); ok {
			continue
		}
		ev := projection.NewEvent(task.EventUnknownDirectory, map[string]string{"directory": "tasks/" + id}, "corral/reconciler")
		if _, err := o.store.Append(ctx, task.SystemStream, eventstore.AnyVersion, ev); err != nil {
			return fmt.Errorf("record unknown task directory: %w", err)
		}
		o.log.Warn("task directory without events", "directory", "tasks/"+id)
	}
	return nil
}

// inDataRoot is host path p relative to the data root, slash-separated;
// a path outside it cannot be mounted.
func (o *Runner) inDataRoot(p string) (string, error) {
	rel, err := filepath.Rel(o.data.Path(), p)
	if err != nil || !filepath.IsLocal(rel) {
		return "", fmt.Errorf("%s is not within the data root %s: %w", p, o.data.Path(), errdefs.ErrFailedPrecondition)
	}
	return filepath.ToSlash(rel), nil
}

// claudeProjectKey is the directory name Claude Code keeps a working
// directory's conversations under (its path with / as -).
func claudeProjectKey(dir string) string { return strings.ReplaceAll(dir, "/", "-") }

// boundChanges is a worker's report of its workspace changes, held to what
// a result may carry: at most 1,000 names in each list (4 KiB each, valid
// UTF-8) and 100 commits, each name and subject through red; Truncated
// says when some were left out.
func boundChanges(in *task.Changes, red func(string) string) *task.Changes {
	if in == nil {
		return nil
	}
	out := &task.Changes{Truncated: in.Truncated, Added: []string{}, Modified: []string{}, Deleted: []string{}, Commits: []task.Commit{}}
	names := func(dst *[]string, src []string) {
		for _, n := range src {
			if len(*dst) >= task.MaxChangedFiles {
				out.Truncated = true
				return
			}
			*dst = append(*dst, red(clip.String(strings.ToValidUTF8(n, "\uFFFD"), 4096)))
		}
	}
	names(&out.Added, in.Added)
	names(&out.Modified, in.Modified)
	names(&out.Deleted, in.Deleted)
	for _, c := range in.Commits {
		if len(out.Commits) >= task.MaxCommits {
			out.Truncated = true
			break
		}
		out.Commits = append(out.Commits, task.Commit{Hash: clip.String(c.Hash, 64), Subject: red(message(c.Subject))})
	}
	return out
}
