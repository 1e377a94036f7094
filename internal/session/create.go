package session

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/ids"
	"github.com/corral-dev/corral/internal/placement"
	"github.com/corral-dev/corral/internal/rtkind"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/corral-dev/corral/internal/workspace"
)

// Create starts a session's sandbox and records it. It returns the session
// and its token, which is shown once and stored only hashed.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (Session, string, error) {
	if err := m.opts.Data.CheckFreeSpace(m.opts.MinFreeBytes); err != nil {
		return Session{}, "", err
	}
	ctx, cancel := detach(ctx)
	defer cancel()
	return m.create(ctx, req, createFrom{})
}

// createFrom is what a fork's session is made from beside its request.
type createFrom struct {
	// forkedFrom is the session it is a fork of.
	forkedFrom string
	// limits and allow are the source's limits and allowlist.
	limits *sandbox.Limits
	allow  []string
	// seed fills its directory (dir, open at its root) before its
	// sandbox starts.
	seed func(ctx context.Context, dir *os.Root) error
	// memory, when not nil, is the source's snapshot the fork's sandbox
	// is restored from.
	memory *snapshot
}

func (m *Manager) create(ctx context.Context, req CreateRequest, from createFrom) (Session, string, error) {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, errdefs.Field(field, fmt.Sprintf(format, args...)))
	}
	rtName := req.Runtime
	if rtName == "" {
		rtName = m.opts.DefaultRuntime
	}
	var lastLimits *sandbox.Limits
	var place *placement.Runtime
	switch p, known := m.opts.Placements.Get(rtName); {
	case !known:
		bad("runtime", "%q is not a runtime (one of: %s)", clip.String(rtName, 64), strings.Join(rtkind.Names(), ", "))
	case p.Unavailable != "" || p.Sandbox == nil:
		why := p.Unavailable
		if why == "" {
			why = "not configured"
		}
		errs = append(errs, &errdefs.FieldError{Field: "runtime", Err: fmt.Errorf("%q is not available: %s: %w", rtName, why, errdefs.ErrFailedPrecondition)})
	default:
		place = p
	}
	// A session on a workspace without an image or limits of its own
	// takes the last ones a session there had (seed 003's project
	// settings).
	if req.Workspace != "" && (req.Image == "" || req.Resources == nil) {
		if last := m.lastOnWorkspace(req.Workspace, rtName); last != nil {
			if req.Image == "" {
				req.Image = last.Image
			}
			if req.Resources == nil && last.limits != nil {
				lastLimits = last.limits
			}
		}
	}
	image := req.Image
	if rtkind.RunsImages(rtName) {
		if image == "" {
			image = m.opts.Image
		}
		if !task.ImageAllowed(m.opts.AllowedImages, image) {
			errs = append(errs, &errdefs.FieldError{Field: "image", Err: fmt.Errorf("%q is not allowed: it must match one of the allowed images %v: %w", clip.String(image, 64), m.opts.AllowedImages, errdefs.ErrFailedPrecondition)})
		}
	} else if image != "" {
		errs = append(errs, &errdefs.FieldError{Field: "image", Err: fmt.Errorf("the %s runtime runs the host's /usr and takes no image: %w", rtName, errdefs.ErrFailedPrecondition)})
	}
	network := req.Network
	if network == "" {
		network = task.NetworkNone
	}
	switch why, ok := m.opts.Networks[network]; {
	case !ok && network != task.NetworkNone:
		bad("network", "%q is not a network policy (one of: none, allowlist, open)", clip.String(network, 32))
	case network != task.NetworkNone && place != nil && place.Remote && place.EgressAddr == "":
		// A pod mounts no socket of the server's host: its exec agent
		// relays to the session's proxy over the server's egress
		// listener, as a task's worker does, or not at all.
		errs = append(errs, &errdefs.FieldError{Field: "network", Err: fmt.Errorf("%q: a session on the %s runtime has network none only here: %s: %w", network, rtName, place.NoEgress, errdefs.ErrFailedPrecondition)})
	case why != "":
		errs = append(errs, &errdefs.FieldError{Field: "network", Err: fmt.Errorf("%q is not available: %s: %w", network, why, errdefs.ErrFailedPrecondition)})
	case network != task.NetworkNone && m.opts.Egress == nil:
		errs = append(errs, &errdefs.FieldError{Field: "network", Err: fmt.Errorf("%q needs the egress proxy, which this server does not run: %w", network, errdefs.ErrFailedPrecondition)})
	}
	limits := m.opts.Limits
	if lastLimits != nil {
		limits = *lastLimits
	}
	if from.limits != nil {
		limits = *from.limits
	}
	if r := req.Resources; r != nil {
		res, err := r.Apply(task.Resources{MemoryBytes: limits.MemoryBytes, CPUMillis: limits.CPUMillis, Pids: limits.Pids})
		errs = append(errs, err)
		limits.MemoryBytes, limits.CPUMillis, limits.Pids = res.MemoryBytes, res.CPUMillis, res.Pids
	}
	idle, life := time.Duration(req.IdleTimeout)*time.Second, time.Duration(req.MaxLifetime)*time.Second
	if idle == 0 {
		idle = m.opts.IdleTimeout
	}
	if life == 0 {
		life = m.opts.MaxLifetime
	}
	if idle < time.Second || idle > m.opts.IdleTimeout {
		bad("idle_timeout", "must be between 1 and %d seconds", int(m.opts.IdleTimeout/time.Second))
	}
	if life < time.Second || life > m.opts.MaxLifetime {
		bad("max_lifetime", "must be between 1 and %d seconds", int(m.opts.MaxLifetime/time.Second))
	}
	for k, v := range req.Labels {
		if len(k) == 0 || len(k) > 63 || len(v) > 255 || strings.ContainsAny(k+v, "\x00\n") || strings.HasPrefix(k, "corral.") {
			bad("labels", "keys of 1 to 63 characters not starting with corral., values of at most 255, no NUL or newline")
			break
		}
	}
	var project workspace.Project
	if req.Workspace != "" {
		pr, err := m.opts.Projects.Resolve(req.Workspace)
		if err != nil {
			errs = append(errs, err)
		} else if err := m.opts.Projects.Check(pr); errors.Is(err, errdefs.ErrNotFound) {
			errs = append(errs, &errdefs.FieldError{Field: "workspace", Err: fmt.Errorf("no workspace %q (POST /api/workspaces): %w", pr.Name, errdefs.ErrFailedPrecondition)})
		} else if err != nil {
			errs = append(errs, &errdefs.FieldError{Field: "workspace", Err: err})
		}
		project, req.Workspace = pr, pr.Name
	}
	if err := errors.Join(errs...); err != nil {
		return Session{}, "", err
	}
	m.mu.Lock()
	n := 0
	for _, s := range m.sessions {
		if s.Status == StatusRunning {
			n++
		}
	}
	m.mu.Unlock()
	if m.opts.MaxSessions > 0 && n >= m.opts.MaxSessions {
		return Session{}, "", fmt.Errorf("%d sessions run already, the limit (sessions.max_sessions); end one first: %w", n, errdefs.ErrResourceExhausted)
	}

	id := idPrefix + ids.New()
	dir := ownDir(id)
	if req.Workspace != "" {
		// A task that just ended holds its workspace until its sandbox is
		// gone, a moment later: wait for that, not for a running writer.
		holder, ok := m.opts.Writers.Acquire(req.Workspace, id)
		for deadline := time.Now().Add(writerWait); !ok && time.Now().Before(deadline) && ctx.Err() == nil; {
			time.Sleep(50 * time.Millisecond)
			holder, ok = m.opts.Writers.Acquire(req.Workspace, id)
		}
		if !ok {
			return Session{}, "", fmt.Errorf("workspace %q is being written by %s; one writer at a time: %w", req.Workspace, holder, errdefs.ErrConflict)
		}
		dir = project.Source()
		if err := m.snapshotGit(id, project); err != nil {
			m.opts.Writers.Release(req.Workspace, id)
			return Session{}, "", err
		}
	} else if err := m.markMaking(id); err != nil {
		return Session{}, "", fmt.Errorf("mark the session's directory as being made: %w", err)
	} else if err := m.opts.Data.Root().MkdirAll(dir, 0o755); err != nil {
		return Session{}, "", fmt.Errorf("create the session's directory: %w", err)
	} else if m.opts.Quota != nil {
		if err := m.opts.Quota.Limit(ctx, id, dir); err != nil {
			m.log.Warn("the session's directory has the polled quota alone", "session_id", id, "err", err)
		}
	}
	if from.seed != nil {
		if err := m.seed(ctx, id, dir, from.seed); err != nil {
			return Session{}, "", err
		}
	}
	self := selfNamed(place)
	release := func() {}
	var fork *forkOf
	var inherited []inheritedExec
	if snap := from.memory; snap != nil {
		// Its source's running commands go on in it: their output so
		// far is its too, and its agent, restored, waits to attach
		// until they are taken over (hold).
		var err error
		if inherited, err = snap.giveExecs(m, id); err != nil {
			return Session{}, "", err
		}
		release = m.hold(id)
		defer release()
		fork = &forkOf{from: snap.from, image: snap.image}
	}
	made := false
	defer func() {
		if !made && req.Workspace != "" {
			m.opts.Writers.Release(req.Workspace, id)
		}
	}()
	h, agentToken, err := m.startSandbox(ctx, place, sandboxOf{id: id, image: image, network: network, allow: from.allow, dir: dir,
		hostDir: req.Workspace != "" && !project.InDataRoot(), limits: limits, self: self, fork: fork})
	if err != nil {
		return Session{}, "", err
	}
	agentHash := hashToken(agentToken)
	if from.memory != nil {
		// Its agent holds its source's token, restored with its memory.
		agentHash = from.memory.agentTokenHash
	}
	token := newToken()
	now := m.opts.Now().UTC()
	m.mu.Lock()
	attached := m.attached
	m.mu.Unlock()
	s := Session{ID: id, Runtime: rtName, Image: image, Network: network, Workspace: req.Workspace, Labels: maps.Clone(req.Labels), Status: StatusRunning,
		Resources: &task.Resources{MemoryBytes: limits.MemoryBytes, CPUMillis: limits.CPUMillis, Pids: limits.Pids}, NetworkAllow: from.allow,
		CreatedAt: now, LastUsedAt: now, IdleTimeout: int(idle / time.Second), MaxLifetime: int(life / time.Second), ForkedFrom: from.forkedFrom}
	if err := m.append(ctx, id, EventCreated, created{Session: s, TokenHash: hashToken(token), AgentTokenHash: agentHash, Handle: *h,
		Replica: m.opts.Members.Self(), Limits: &limits, Dir: dir, HostDir: req.Workspace != "" && !project.InDataRoot(), SelfNamed: self,
		InheritedExecs: inherited}); err != nil {
		place.Sandbox.Destroy(context.WithoutCancel(ctx), id)
		return Session{}, "", err
	}
	if len(inherited) > 0 {
		m.restoreExecs(ctx, id)
	}
	release()
	if req.Workspace == "" {
		os.Remove(m.makingPath(id))
	}
	// The agent dials in a few milliseconds after its sandbox starts (more
	// under gVisor). Every command runs through it, inside the sandbox's
	// own view: a session that never gets one is no session.
	if !m.waitAgent(ctx, id, attached, agentWait) {
		m.end(context.WithoutCancel(ctx), id, "agent_not_connected")
		return Session{}, "", fmt.Errorf("the session's exec agent did not connect within %s; the session is ended: %w", agentWait, errdefs.ErrUnavailable)
	}
	m.log.Info("session created", "session_id", id, "runtime", rtName, "image", image)
	made = true
	got, err := m.get(id)
	return got, token, err
}

// quotaTick is how often Reap looks for session directories due a quota
// check; each is checked as soon as Quota asked.
const quotaTick = 25 * time.Millisecond

// sandboxOf is what a session's sandbox is made of.
type sandboxOf struct {
	id, image, network string
	allow              []string // the session's own allowlist, nil: the server's
	dir                string   // its directory, relative to the data root or (hostDir) a host path
	hostDir            bool
	limits             sandbox.Limits
	// restore, when not "", is the checkpoint to restore the sandbox
	// from (its runtime is a sandbox.Checkpointer).
	restore string
	// self: its sandbox has the session's id in workerproto.SelfDir.
	self bool
	// fork, when not nil, is the checkpoint of another session's
	// sandbox it is restored from (its runtime is a sandbox.Forker).
	fork *forkOf
}

// forkOf is the checkpoint of sandbox from, in image, a fork's sandbox
// is restored from.
type forkOf struct{ from, image string }

// selfNamed reports whether the sandboxes of sessions on p have their
// session's id in workerproto.SelfDir: where a fork's sandbox can be
// restored from its source's memory, and its agent must learn whose it
// now is. That directory is in run/sessions/<id>, the server's alone: a
// runtime that forks memory mounts it with a process of its own as root
// (gVisor's gofer), not as the sandbox's identity.
func selfNamed(p *placement.Runtime) bool {
	if p == nil || p.Remote {
		return false
	}
	_, ok := p.Sandbox.(sandbox.Forker)
	return ok
}

// writeSelf writes session id's workerproto.SelfFile, read-only, in a
// directory of the server's, and returns that directory's path in the
// data root.
func (m *Manager) writeSelf(id string) (string, error) {
	rel := filepath.Join(workspace.DirRun, "sessions", id, "self")
	dir := m.opts.Data.HostPath(rel)
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return "", fmt.Errorf("create the session's own directory: %w", err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return "", fmt.Errorf("create the session's self directory: %w", err)
	}
	// Not flushed: every start of the sandbox (its resumes too) writes it.
	if err := workspace.WriteFileAtomicNoSync(m.opts.Data.Root(), filepath.Join(rel, workerproto.SelfFile), []byte(id+"\n"), 0o444); err != nil {
		return "", fmt.Errorf("write the session's id for its sandbox: %w", err)
	}
	return filepath.ToSlash(rel), nil
}

// startSandbox starts a session's sandbox on p (its egress proxy first,
// with a network), with a new token for its exec agent; it returns the
// sandbox's handle and that token. The agent dials the server's socket,
// or, from a remote runtime's sandbox (a pod), its URL.
func (m *Manager) startSandbox(ctx context.Context, p *placement.Runtime, o sandboxOf) (*sandbox.Handle, string, error) {
	rt := p.Sandbox
	labels := map[string]string{sandbox.LabelManaged: "true", labelSession: "true"}
	agentToken := newToken()
	spec := sandbox.Spec{
		ID:      o.id,
		Image:   o.image,
		Command: []string{workerproto.WorkerBinary, "worker", "session"},
		Dir:     Dir,
		// Its exec agent lives as long as the session: sized for the
		// host's CPUs, it would hold every P's structures all that time.
		Env:     []string{workerproto.EnvSessionID + "=" + o.id, workerproto.EnvSessionToken + "=" + agentToken, workerproto.MaxProcsEnv()},
		Mounts:  append([]sandbox.Mount{{Source: o.dir, Target: Dir, HostDir: o.hostDir}}, m.opts.Base.Mounts(p.Remote)...),
		Limits:  o.limits,
		Network: sandbox.NetworkNone,
		Labels:  labels,
	}
	if o.self {
		rel, err := m.writeSelf(o.id)
		if err != nil {
			return nil, "", err
		}
		spec.Mounts = append(spec.Mounts, sandbox.Mount{Source: rel, Target: workerproto.SelfDir, ReadOnly: true})
	}
	if p.Remote {
		spec.Env = append(spec.Env, workerproto.EnvServerURL+"="+p.ServerURL)
	} else {
		spec.Env = append(spec.Env, workerproto.EnvServerSocket+"="+workerproto.ServerSocket(m.opts.Members.Self()))
	}
	if o.network != task.NetworkNone {
		// As for tasks: loopback only in the sandbox, and the agent relays
		// 127.0.0.1:3128 to this session's proxy over a mounted socket,
		// or, from a pod, over the server's egress listener with the
		// session's key (which the pod's Secret holds, as a task's).
		hostDir, err := m.opts.Egress.Open(o.id, o.network, o.allow)
		if err != nil {
			return nil, "", fmt.Errorf("start the session's egress proxy: %w", err)
		}
		if p.Remote {
			spec.Env = append(spec.Env, workerproto.EnvSessionEgressAddr+"="+p.EgressAddr,
				workerproto.EnvSessionEgressKey+"="+hex.EncodeToString(m.opts.Egress.Key(o.id)))
		} else {
			rel, err := filepath.Rel(m.opts.Data.Path(), hostDir)
			if err != nil || !filepath.IsLocal(rel) {
				m.opts.Egress.Close(o.id)
				return nil, "", fmt.Errorf("the egress proxy's directory %s is not in the data root: %w", hostDir, errdefs.ErrFailedPrecondition)
			}
			spec.Mounts = append(spec.Mounts, placement.EgressMount(filepath.ToSlash(rel)))
		}
		spec.Network = sandbox.NetworkEgress
		spec.Env = append(spec.Env, workerproto.EnvSessionEgress+"=1")
		spec.Env = append(spec.Env, m.opts.Egress.SandboxEnv(o.network)...)
	}
	var h *sandbox.Handle
	var err error
	fk, forks := rt.(sandbox.Forker)
	cp, restores := rt.(sandbox.Checkpointer)
	switch {
	case o.fork != nil && forks:
		h, err = fk.Fork(ctx, o.fork.from, spec, o.fork.image)
	case o.fork != nil:
		err = fmt.Errorf("runtime %s does not restore a sandbox from another's memory: %w", p.Name, errdefs.ErrFailedPrecondition)
	case o.restore != "" && restores:
		h, err = cp.Restore(ctx, spec, o.restore)
	default:
		h, err = rt.Create(ctx, spec)
	}
	if err != nil {
		if o.network != task.NetworkNone {
			m.opts.Egress.Close(o.id)
		}
		err = fmt.Errorf("start the session's sandbox: %w", err)
		if !errdefs.Classified(err) {
			// The runtime could not start it (an engine's refusal, a
			// binary missing on its host): the caller's to read, as a
			// task's start failure is, not an internal error.
			err = fmt.Errorf("%w: %w", err, errdefs.ErrUnavailable)
		}
		return nil, "", err
	}
	return h, agentToken, nil
}

// lastOnWorkspace is the newest session made on workspace (by its name)
// on runtime rt, or nil.
func (m *Manager) lastOnWorkspace(workspace, rt string) *state {
	m.mu.Lock()
	defer m.mu.Unlock()
	var last *state
	for _, s := range m.sessions {
		if s.Workspace == workspace && s.Runtime == rt && (last == nil || s.CreatedAt.After(last.CreatedAt)) {
			last = s
		}
	}
	return last
}
