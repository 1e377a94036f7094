package orchestrator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/library"
	"github.com/corral-dev/corral/internal/rtkind"
	"github.com/corral-dev/corral/internal/service"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/units"
	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/corral-dev/corral/internal/workspace"
)

// Input bounds that are not configurable: they only keep a request sane.
const (
	maxContextFiles = 100
	maxCommandArgs  = 256
	maxArgBytes     = 8192
	maxLabels       = 32
	maxShortField   = 255
)

// labelKey is compiled on first use: package initialisation runs in every
// corral process, including each sandbox's worker, which never needs it.
var labelKey = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?$`)
})

// Spawn validates req, creates the task directory with prompt.md and the
// context files, records the task and queues it (SPEC §2).
func (o *Orchestrator) Spawn(ctx context.Context, req service.SpawnRequest) (task.Task, bool, error) {
	return o.spawn(ctx, req, o.opts.Images.Allowed, nil)
}

// spawn is Spawn with the image allowlist given, and mod, when not nil,
// changing the validated spec (a code_execute call's kind and timeout).
func (o *Orchestrator) spawn(ctx context.Context, req service.SpawnRequest, allowed []string, mod func(*task.Spec)) (task.Task, bool, error) {
	if o.opts.Disabled {
		return task.Task{}, false, fmt.Errorf("workers are disabled on this server (ai_worker_config.enabled: false): no new task is taken: %w", errdefs.ErrUnavailable)
	}
	if err := o.lib.CheckFreeSpace(); err != nil {
		return task.Task{}, false, err
	}
	hash := requestHash(req)
	var prev task.Task
	var prevErr error
	if req.FollowUpOf != "" {
		prev, prevErr = o.followUp(&req)
	}
	spec, err := o.validate(req, allowed)
	err = errors.Join(err, prevErr)
	if mod != nil {
		mod(&spec)
	}
	spec.FollowUpOf = req.FollowUpOf
	atts, attErrs := o.lib.CheckAttachments(req.AttachmentIDs)
	docs, docErrs := o.lib.CheckDocuments(ctx, req.DocumentIDs, req.NoteQuery)
	attErrs = append(attErrs, docErrs...)
	if err != nil || len(attErrs) > 0 {
		return task.Task{}, false, errors.Join(append([]error{err}, attErrs...)...)
	}
	spec.AttachmentIDs = req.AttachmentIDs
	library.SpecWithDocuments(&spec, req.DocumentIDs, req.NoteQuery, docs)
	if spec.IdempotencyKey != "" {
		o.spawnMu.Lock()
		defer o.spawnMu.Unlock()
		t, ok, err := o.tasks.ByIdempotencyKey(spec.IdempotencyKey)
		if err != nil {
			return task.Task{}, false, err
		}
		if ok {
			if h := o.requestHashOf(ctx, t.ID); h != "" && h != hash {
				return task.Task{}, false, fmt.Errorf("idempotency_key %q was used for a task with other arguments (%s): %w", spec.IdempotencyKey, t.ID, errdefs.ErrConflict)
			}
			return t, true, nil
		}
	}
	id := task.NewID()
	release, err := o.reserveQueueSlot(id)
	if err != nil {
		return task.Task{}, false, err
	}
	defer release()

	dir, err := o.data.CreateTask(id)
	if err != nil {
		return task.Task{}, false, err
	}
	defer dir.Close()
	ok := false
	defer func() {
		if !ok {
			o.data.RemoveTask(id)
		}
	}()
	if err := o.copyContext(dir, spec.ContextFiles); err != nil {
		return task.Task{}, false, err
	}
	attNames, err := o.lib.CopyAttachments(dir, atts, library.ContextNames(spec.ContextFiles), o.lib.ContextLeft(dir))
	if err != nil {
		return task.Task{}, false, err
	}
	in := PromptInput{Spec: spec, Attachments: library.PromptAttachments(atts, attNames)}
	if in.Documents, in.Notes, err = o.lib.CopyDocuments(dir, docs); err != nil {
		return task.Task{}, false, err
	}
	if spec.FollowUpOf != "" {
		if err := o.copyFollowUp(dir, prev, spec.Agent); err != nil {
			return task.Task{}, false, err
		}
		in.FollowUp = &prev
	}
	in.Skills, in.MoreSkills = o.lib.PromptSkills()
	prompt := []byte(Prompt(in))
	if err := workspace.WriteFileAtomicNoSync(dir, workerproto.PromptFile, prompt, 0o644); err != nil {
		return task.Task{}, false, fmt.Errorf("write prompt.md: %w", err)
	}
	// What the spawn wrote (prompt.md, the context files) reaches the
	// disk while the task's first events do, not before them: the answer
	// waits for both, and a task whose prompt.md a crash in between left
	// other than its hash does not start (Prepare).
	syncInputs, err := workspace.SyncTreeLater(dir)
	if err != nil {
		return task.Task{}, false, fmt.Errorf("open the task's files to sync them: %w", err)
	}
	synced := make(chan error, 1)
	go func() { synced <- syncInputs() }()
	sum := sha256.Sum256(prompt)
	actor := service.ActorFrom(ctx)
	evs := []eventstore.Proposed{
		projection.NewEvent(task.EventCreated, task.Created{Spec: spec, RequestHash: hash, PromptSHA256: hex.EncodeToString(sum[:])}, actor),
		projection.NewEvent(task.EventQueued, nil, actor),
	}
	// A task that can start at once is given its replica in this commit,
	// not in one of its own after it: one fsync fewer before its sandbox.
	starting, admitted, ok := o.opts.Admit(spec)
	if ok {
		evs = append(evs, starting)
	}
	t, err := o.tasks.Create(ctx, id, evs...)
	if ok {
		admitted()
	}
	serr := <-synced
	if err != nil {
		return task.Task{}, false, err
	}
	if ok {
		// The spawn answers as SPEC §2 has it: the task is recorded and
		// queued. That it is starting already (or further on, if its
		// scheduler was quick) is the next read's news.
		t.Status = task.Queued
	}
	if serr != nil {
		// The task is recorded and will start, or fail at its start if a
		// crash takes its prompt.md.
		o.log.Warn("the task's files not synced to disk", "task_id", id, logkey.Error, serr)
	}
	ok = true
	o.log.Info("task queued", "task_id", id, "agent", spec.Agent, "runtime", spec.Runtime)
	return t, false, nil
}

// reserveQueueSlot counts the spawn of task id against
// limits.max_queued_tasks until release: the queue's count and the spawns
// between their check and their task's creation never pass the bound
// together. A spawn whose task the projection already holds is counted
// there only, so the bound is reached exactly, not one short.
func (o *Orchestrator) reserveQueueSlot(id string) (release func(), err error) {
	max := o.opts.Limits.MaxQueued
	if max <= 0 {
		return func() {}, nil
	}
	o.queueMu.Lock()
	defer o.queueMu.Unlock()
	if n := o.tasks.Waiting(maps.Keys(o.spawning)); n >= max {
		return nil, fmt.Errorf("the queue is full (%d tasks waiting); try again later: %w", max, errdefs.ErrResourceExhausted)
	}
	if o.spawning == nil {
		o.spawning = map[string]bool{}
	}
	o.spawning[id] = true
	return func() {
		o.queueMu.Lock()
		delete(o.spawning, id)
		o.queueMu.Unlock()
	}, nil
}

// validate checks every field and returns the task's spec with defaults
// filled in, or every problem at once.
func (o *Orchestrator) validate(req service.SpawnRequest, allowed []string) (task.Spec, error) {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, errdefs.Field(field, fmt.Sprintf(format, args...)))
	}
	lim := o.opts.Limits

	desc := req.TaskDescription
	switch {
	case strings.TrimSpace(desc) == "":
		bad("task_description", "is required and must not be blank")
	case !utf8.ValidString(desc) || strings.ContainsRune(desc, 0):
		bad("task_description", "must be UTF-8 text without NUL bytes")
	case lim.MaxPromptBytes > 0 && int64(len(desc)) > lim.MaxPromptBytes:
		errs = append(errs, &errdefs.FieldError{Field: "task_description", Err: fmt.Errorf("is %d bytes, over the limit of %s: %w", len(desc), units.FormatSize(lim.MaxPromptBytes), errdefs.ErrTooLarge)})
	}

	spec := task.Spec{
		Description:    desc,
		Agent:          req.Agent,
		Model:          req.Model,
		Command:        req.Command,
		Runtime:        req.Runtime,
		Image:          req.Image,
		Network:        req.Network,
		NetworkAllow:   req.NetworkAllow,
		Credentials:    req.Credentials,
		Resources:      o.opts.Defaults.Resources,
		Labels:         req.Labels,
		IdempotencyKey: req.IdempotencyKey,
		ExecSession:    req.SessionID,
		Workspace:      req.Workspace,
		SaveToShared:   req.SaveToShared,
		Origin: task.Origin{ConversationID: req.ConversationID, InterfaceType: req.InterfaceType, UserName: req.UserName,
			OriginWorkspace: req.OriginWorkspace, OriginConversation: req.OriginConversation},
	}

	// The seed's model is the agent choice ("claude" or "gemini"), which
	// an explicit agent wins over (also over a client filling in model's
	// schema default); the record keeps it as given, and the agent is not
	// handed it as a model name (taskrun). Any other value is a model name
	// passed to the agent.
	if task.KnownAgent(spec.Model) && spec.Agent == "" {
		spec.Agent = spec.Model
	}
	if spec.Agent == "" {
		spec.Agent = o.opts.Defaults.Agent
		if len(req.Command) > 0 && req.Agent == "" && req.Model == "" {
			spec.Agent = task.AgentCommand
		}
	}
	if !task.KnownAgent(spec.Agent) {
		bad("agent", "%q is not an agent (one of: claude, gemini, codex, opencode, command)", clip.String(spec.Agent, 64))
	} else if o.opts.AgentCredentials != nil {
		if why := o.opts.AgentCredentials(spec.Agent, o.opts.Agents[spec.Agent]); why != "" {
			errs = append(errs, &errdefs.FieldError{Field: "agent", Err: fmt.Errorf("%s: %w", why, errdefs.ErrFailedPrecondition)})
		}
	}
	if spec.Workspace != "" {
		if pr, err := o.lib.ResolveWorkspace(spec.Workspace); err != nil {
			errs = append(errs, err)
		} else if err := o.lib.CheckProject(pr); errors.Is(err, errdefs.ErrNotFound) {
			errs = append(errs, &errdefs.FieldError{Field: "workspace", Err: fmt.Errorf("no workspace %q: create it first (POST /api/workspaces, or spawn_workspace_task with init_git): %w", pr.Name, errdefs.ErrFailedPrecondition)})
		} else if err != nil {
			errs = append(errs, &errdefs.FieldError{Field: "workspace", Err: err})
		} else {
			spec.Workspace = pr.Name
		}
	}
	if spec.ExecSession != "" {
		switch {
		case spec.Agent != task.AgentClaude:
			errs = append(errs, &errdefs.FieldError{Field: "session_id", Err: fmt.Errorf("the %s agent cannot run its commands in a session; claude can (its shell tool is turned off and workspace_exec put in its place): %w", clip.String(spec.Agent, 32), errdefs.ErrFailedPrecondition)})
		case o.opts.Sessions == nil:
			errs = append(errs, &errdefs.FieldError{Field: "session_id", Err: fmt.Errorf("sessions are not served here: %w", errdefs.ErrNotImplemented)})
		default:
			if err := o.opts.Sessions.Running(spec.ExecSession); err != nil {
				errs = append(errs, &errdefs.FieldError{Field: "session_id", Err: err})
			}
		}
	}
	if len(spec.Model) > maxShortField || strings.ContainsAny(spec.Model, "\x00\n") {
		bad("model", "must be a model name of at most %d bytes", maxShortField)
	}
	if spec.Agent == task.AgentCommand {
		if len(req.Command) == 0 {
			bad("command", "is required for the command agent (the argv to run in /task)")
		}
	} else if len(req.Command) > 0 {
		bad("command", "applies only to the command agent, not %q", spec.Agent)
	}
	if len(req.Command) > maxCommandArgs {
		bad("command", "has %d arguments, over the limit of %d", len(req.Command), maxCommandArgs)
	}
	for i, a := range req.Command {
		if len(a) > maxArgBytes || strings.ContainsRune(a, 0) || !utf8.ValidString(a) {
			bad(fmt.Sprintf("command[%d]", i), "must be UTF-8 without NUL bytes, at most %d bytes", maxArgBytes)
		}
	}
	if i := len(req.Command); i > 0 && strings.TrimSpace(req.Command[0]) == "" {
		bad("command[0]", "must name a program")
	}

	spec.TimeoutMinutes = lim.DefaultTimeoutMin
	if req.TimeoutMinutes != nil {
		spec.TimeoutMinutes = *req.TimeoutMinutes
	}
	if spec.TimeoutMinutes < 1 || spec.TimeoutMinutes > lim.MaxTimeoutMin {
		bad("timeout_minutes", "must be between 1 and %d, got %d", lim.MaxTimeoutMin, spec.TimeoutMinutes)
	}

	if spec.Runtime == "" {
		spec.Runtime = o.opts.Defaults.Runtime
	}
	if why, ok := o.opts.Runtimes[spec.Runtime]; !ok {
		bad("runtime", "%q is not a runtime (one of: %s)", clip.String(spec.Runtime, 64), strings.Join(rtkind.Names(), ", "))
	} else if why != "" {
		errs = append(errs, &errdefs.FieldError{Field: "runtime", Err: fmt.Errorf("%q is not available: %s: %w", spec.Runtime, why, errdefs.ErrFailedPrecondition)})
	}
	if rtkind.RunsImages(spec.Runtime) {
		// The agent is looked for in the image when the task starts.
		if spec.Image == "" {
			spec.Image = o.opts.Images.Default
		}
		if len(spec.Image) > maxShortField || strings.ContainsAny(spec.Image, "\x00\n ") {
			bad("image", "must be an image reference of at most %d bytes", maxShortField)
		} else if !task.ImageAllowed(allowed, spec.Image) {
			errs = append(errs, &errdefs.FieldError{Field: "image", Err: fmt.Errorf("%q is not allowed: it must match one of the allowed images %v: %w",
				clip.String(spec.Image, 64), allowed, errdefs.ErrFailedPrecondition)})
		}
	} else {
		if spec.Image != "" {
			bad("image", "applies only to the docker and kubernetes runtimes; %q runs the host's /usr", spec.Runtime)
		}
		if task.KnownAgent(spec.Agent) && o.opts.Agents != nil && o.opts.AgentMissing != nil {
			if why := o.opts.AgentMissing(spec.Agent, o.opts.Agents[spec.Agent]); why != "" {
				errs = append(errs, &errdefs.FieldError{Field: "agent", Err: fmt.Errorf("%s: %w", why, errdefs.ErrFailedPrecondition)})
			}
		}
	}
	noEgress := o.opts.NoEgress[spec.Runtime]
	switch {
	case spec.Network == "" && noEgress != "":
		spec.Network = task.NetworkNone
	case spec.Network == "":
		spec.Network = o.opts.Defaults.Network
	case spec.Network != task.NetworkNone && noEgress != "":
		errs = append(errs, &errdefs.FieldError{Field: "network", Err: fmt.Errorf("%q on the %s runtime: %s; only none: %w", clip.String(spec.Network, 64), spec.Runtime, noEgress, errdefs.ErrFailedPrecondition)})
	}
	errs = append(errs, o.checkNetwork(spec.Network, spec.NetworkAllow, "network", "network_allow"))
	errs = append(errs, service.CheckCredentials(o.opts.Credentials, spec.Network, spec.Credentials, "credentials"))

	if r := req.Resources; r != nil {
		var err error
		spec.Resources, err = r.Apply(spec.Resources)
		errs = append(errs, err)
	}

	if n := len(req.ContextFiles) + len(req.SharedFiles); n > maxContextFiles {
		bad("context_files", "has %d files with shared_files, over the limit of %d", n, maxContextFiles)
	}
	seen := map[string]bool{}
	for i, p := range append(slices.Clip(req.ContextFiles), req.SharedFiles...) {
		field := fmt.Sprintf("context_files[%d]", i)
		if i >= len(req.ContextFiles) {
			field = fmt.Sprintf("shared_files[%d]", i-len(req.ContextFiles))
		}
		c, err := workspace.Clean(p)
		if err != nil {
			errs = append(errs, &errdefs.FieldError{Field: field, Err: err})
			continue
		}
		if c == "." {
			bad(field, "must name a file under shared/")
			continue
		}
		if seen[path.Base(c)] {
			bad(field, "another context file has the name %q", path.Base(c))
			continue
		}
		seen[path.Base(c)] = true
		spec.ContextFiles = append(spec.ContextFiles, c)
	}

	for name, f := range map[string]string{"conversation_id": req.ConversationID, "interface_type": req.InterfaceType, "user_name": req.UserName, "idempotency_key": req.IdempotencyKey} {
		if len(f) > maxShortField || strings.ContainsRune(f, 0) || !utf8.ValidString(f) {
			bad(name, "must be UTF-8 of at most %d bytes", maxShortField)
		}
	}
	if len(req.Labels) > maxLabels {
		bad("labels", "has %d labels, over the limit of %d", len(req.Labels), maxLabels)
	}
	for k, v := range req.Labels {
		if !labelKey().MatchString(k) {
			bad("labels", "key %q must be lowercase letters, digits, '.', '_', '/' or '-', at most 63", clip.String(k, 64))
		}
		if len(v) > maxShortField || !utf8.ValidString(v) {
			bad("labels."+k, "must be UTF-8 of at most %d bytes", maxShortField)
		}
	}
	return spec, errors.Join(errs...)
}

// copyContext copies the context files from shared/ into context/. Copies,
// not links: the worker may change its copy, never the shared original, and
// the task sees the files as they were when it was spawned.
func (o *Orchestrator) copyContext(dir *os.Root, files []string) error {
	budget := o.opts.Limits.MaxContextBytes
	for i, f := range files {
		n, err := workspace.CopyFileNoSync(o.data.Shared(), f, dir, "context/"+path.Base(f), budget)
		if err != nil {
			return &errdefs.FieldError{Field: fmt.Sprintf("context_files[%d]", i), Err: err}
		}
		budget -= n
	}
	return nil
}

// requestHash identifies a spawn request's arguments, without the key.
func requestHash(req service.SpawnRequest) string {
	req.IdempotencyKey = ""
	b, _ := json.Marshal(req)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:12])
}

// requestHashOf returns the request hash recorded when a task was created.
func (o *Orchestrator) requestHashOf(ctx context.Context, id string) string {
	evs, err := o.store.ReadStream(ctx, task.StreamID(id), 0)
	if err != nil || len(evs) == 0 || evs[0].Type != task.EventCreated {
		return ""
	}
	var c task.Created
	json.Unmarshal(evs[0].Data, &c)
	return c.RequestHash
}
