// Package app wires Corral together: configuration in, the event store, the
// data root, the runtimes, the scheduler, the orchestrator and the HTTP
// server out. It is the only package that names concrete backends.
package app

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/attachment"
	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/connlimit"
	"github.com/corral-dev/corral/internal/egress"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/postgres"
	"github.com/corral-dev/corral/internal/eventstore/sqlite"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/library"
	"github.com/corral-dev/corral/internal/lockfile"
	"github.com/corral-dev/corral/internal/mcpserver"
	"github.com/corral-dev/corral/internal/notify"
	"github.com/corral-dev/corral/internal/orchestrator"
	"github.com/corral-dev/corral/internal/placement"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/quota"
	"github.com/corral-dev/corral/internal/report"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes"
	"github.com/corral-dev/corral/internal/scheduler"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/session"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/taskrun"
	"github.com/corral-dev/corral/internal/tools"
	"github.com/corral-dev/corral/internal/version"
	"github.com/corral-dev/corral/internal/webhook"
	"github.com/corral-dev/corral/internal/workspace"
)

// Options are what a caller of New decides beyond the configuration.
type Options struct {
	// Binary is the corral executable that sandboxes mount for their
	// agents; corral-worker, which they run, must be beside it, from the
	// same build. Default: this process's executable.
	Binary string
	// Now is the clock of retention and save_to_shared; nil means
	// time.Now. Tests move it forward to age tasks and attachments.
	Now func() time.Time
}

// App is a running Corral server. New opens everything, Run serves until
// its context ends, Close releases what New opened.
type App struct {
	cfg  *config.Config
	log  *slog.Logger
	opts Options

	store    eventstore.Store
	pg       *postgres.Store           // store, when it is PostgreSQL's
	members  cluster.Members           // the replicas on the store: Solo on SQLite
	rootLock *lockfile.File            // the data root's, taken here when the store is not SQLite's (which takes it)
	sockets  sockets                   // the unix sockets sandboxes reach
	commits  func() sqlite.CommitStats // the store's commits, for /metrics
	data     *workspace.DataRoot
	attRoot  *os.Root // attachments/
	docs     documentIndex
	tasks    *projection.Tasks
	orch     *orchestrator.Orchestrator
	lib      *library.Library
	runner   *taskrun.Runner
	sched    *scheduler.Scheduler
	api      *httpapi.Server
	notifier *notify.Dispatcher // nil when notifications are off
	// placements are the runtimes: each one's sandbox and what the
	// server knows of it.
	placements *placement.Set
	sessions   *session.Manager
	// sandboxUser is the host identity sandboxes run as.
	sandboxUser hostuser.Identity

	egress      *egress.Server // the per-task egress proxies
	egressAllow []egress.Rule
	egressCreds []configuredCredential
	egressCA    []byte // the DER of the proxy's CA; nil without credential rules
	egressRec   *egressRecorder

	ln       net.Listener // the HTTP API
	egressLn net.Listener // the egress of sandboxes on other machines; nil if off
	// egressKey is the key a connection to egressLn proves its task with.
	egressKey func(id string) []byte
	// egressProven opens the proxy of a task a connection to egressLn
	// has proved, where another replica started it.
	egressProven func(id string)
	token        string
	// replicaToken is the API token this replica sends another replica
	// a session's command with: the unnamed one, else the first named.
	replicaToken string
}

// New opens the data root and the event store, rebuilds the task
// projection and builds every component. It listens but does not serve yet.
func New(ctx context.Context, cfg *config.Config, log *slog.Logger, opts Options) (*App, error) {
	a := &App{cfg: cfg, log: log, opts: opts}
	if err := a.open(ctx); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

func (a *App) open(ctx context.Context) error {
	cfg := a.cfg
	if err := checkCrashPoint(cfg.CrashAt); err != nil {
		return err
	}
	secrets, err := cfg.Secrets()
	if err != nil {
		return err
	}
	if err := checkModelAPIs(agentConfigs(cfg)); err != nil {
		return err
	}
	a.token, a.replicaToken = secrets.APIToken, secrets.APIToken
	var tokens []httpapi.Token
	for _, t := range secrets.APITokens {
		tokens = append(tokens, httpapi.Token{Name: t.Name, Value: t.Token})
		if a.replicaToken == "" {
			a.replicaToken = t.Token
		}
	}
	if a.data, err = workspace.Open(cfg.Data); err != nil {
		return err
	}
	if err := a.openStore(ctx, secrets.StoreDSN); err != nil {
		return err
	}
	a.tasks = projection.New(a.store, a.log.With("subsystem", "projection"))
	if err := a.tasks.Rebuild(ctx); err != nil {
		return err
	}
	if err := a.openDocuments(ctx); err != nil {
		return err
	}
	secret := secrets.WebhookSecret
	if secret == nil {
		if secret, err = a.generatedSecret(); err != nil {
			return err
		}
	}
	if a.opts.Binary == "" {
		if a.opts.Binary, err = os.Executable(); err != nil {
			return fmt.Errorf("find the corral executable for workers: %w", err)
		}
	}
	if a.sandboxUser, err = sandboxIdentity(a.cfg); err != nil {
		return err
	}
	if err := a.closeDataRoot(a.sandboxUser); err != nil {
		return err
	}
	binDir, err := a.stageBinaries(a.opts.Binary)
	if err != nil {
		return err
	}
	sandboxes, err := a.openRuntimes(ctx)
	if err != nil {
		return err
	}
	available, networks := a.availability(ctx, sandboxes)
	if err := a.openEgress(secrets); err != nil {
		return err
	}
	egressAddr, err := a.listenEgress(secret)
	if err != nil {
		return err
	}
	a.placements = a.place(sandboxes, available, egressAddr)
	if a.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	if k, ok := a.placements.Sandboxes()[kubernetes.Name].(*kubernetes.Runtime); ok {
		// Worker pods post here, and what runs in them is hostile: none
		// may take the server's descriptors. Clients are not bounded.
		a.ln = connlimit.Pods(a.ln, connlimit.PerSandbox, k.PodAddr, a.log.With("subsystem", "http"))
	}
	if err := a.join(ctx); err != nil {
		return err
	}

	sockDir := a.data.HostPath(workspace.DirRun, "sock")
	lim := cfg.Limits
	w := cfg.AIWorker
	if a.attRoot, err = a.data.Root().OpenRoot(workspace.DirAttachments); err != nil {
		return fmt.Errorf("open attachments: %w", err)
	}
	attachments := attachment.New(a.attRoot, attachment.Options{MaxFileBytes: lim.MaxUploadBytes.Bytes(), Now: a.opts.Now})
	lost, err := attachments.Migrate()
	if err != nil {
		return err
	}
	for _, id := range lost {
		a.log.Warn("attachment content lost before this version: a .json file's metadata overwrote it; its download says so", "attachment_id", id)
	}
	bin, err := filepath.Rel(a.data.Path(), binDir)
	if err != nil || !filepath.IsLocal(bin) {
		return fmt.Errorf("the worker binaries' directory %s is not in the data root", binDir)
	}
	projects, err := workspace.NewProjects(a.data, cfg.Workspaces.Roots)
	if err != nil {
		return err
	}
	// One writer per named workspace, tasks and sessions alike.
	writers := &task.Writers{}
	// One quota for task and session directories.
	dirQuota := a.taskQuota()
	a.sessions = session.New(session.Options{
		Crash:          crashHook(cfg.CrashAt, a.log),
		Store:          a.store,
		Data:           a.data,
		Projects:       projects,
		Placements:     a.placements,
		DefaultRuntime: cfg.Runtime,
		Base:           placement.Base{BinDir: filepath.ToSlash(bin), SocketDir: workspace.DirRun + "/sock"},
		Egress:         sessionEgress{a.egressProxies(), secret},
		Networks:       networks,
		CheckAllow:     a.checkAllow,
		Writers:        writers,
		Image:          w.AICoderImage,
		AllowedImages:  w.AllowedImages,
		Limits: sandbox.Limits{
			MemoryBytes: w.Resources.MemoryLimit.Bytes(),
			CPUMillis:   w.Resources.CPULimit.Millis(),
			Pids:        int64(w.Resources.PidsLimit),
		},
		MaxSessions: cfg.Sessions.MaxSessions,
		IdleTimeout: time.Duration(cfg.Sessions.IdleTimeout),
		MaxLifetime: time.Duration(cfg.Sessions.MaxLifetime),
		IdleAction:  cfg.Sessions.IdleAction,
		TaskEnded: func(id string) bool {
			st, _, ok := a.tasks.Status(id)
			return !ok || st.Terminal()
		},
		Quota:        sessionQuota{dirQuota},
		AllowHooks:   cfg.Workspaces.AllowHooks,
		Retention:    time.Duration(w.TaskRetentionHours) * time.Hour,
		MinFreeBytes: cfg.Limits.MinFreeDisk.Bytes(),
		StopGrace:    time.Duration(cfg.Limits.StopGrace),
		Members:      a.members,
	}, a.log.With("subsystem", "sessions"))
	a.lib = library.New(library.Options{
		Store:       a.store,
		Tasks:       a.tasks,
		Data:        a.data,
		Projects:    projects,
		Documents:   a.docs.ix,
		Attachments: attachments,
		Limits: library.Limits{
			MaxTaskDirBytes: lim.MaxTaskDirBytes.Bytes(),
			MaxContextBytes: lim.MaxContextBytes.Bytes(),
			MaxReadBytes:    256 << 10,
			MaxWriteBytes:   lim.MaxWriteBytes.Bytes(),
			MaxSharedBytes:  lim.MaxSharedBytes.Bytes(),
			MinFreeBytes:    lim.MinFreeDisk.Bytes(),
		},
		Retention: library.Retention{
			TaskDirs:    time.Duration(w.TaskRetentionHours) * time.Hour,
			Attachments: time.Duration(w.AttachmentRetentionHours) * time.Hour,
			Events:      time.Duration(w.EventRetentionHours) * time.Hour,
			Interval:    time.Duration(w.RetentionInterval),
		},
		Now: a.opts.Now,
	}, a.log.With("subsystem", "library"))
	a.orch = orchestrator.New(orchestrator.Options{
		Disabled: !w.Enabled,
		Store:    a.store,
		Tasks:    a.tasks,
		Data:     a.data,
		Library:  a.lib,
		Limits: orchestrator.Limits{
			MaxPromptBytes:    lim.MaxPromptBytes.Bytes(),
			MaxContextBytes:   lim.MaxContextBytes.Bytes(),
			MaxQueued:         w.MaxQueuedTasks,
			DefaultTimeoutMin: w.DefaultTimeoutMinutes,
			MaxTimeoutMin:     w.MaxTimeoutMinutes,
			StopGrace:         time.Duration(lim.StopGrace),
		},
		Defaults: orchestrator.Defaults{
			Agent:   cfg.Agents.Default,
			Runtime: cfg.Runtime,
			Network: cfg.Egress.Mode,
			Resources: task.Resources{
				MemoryBytes: w.Resources.MemoryLimit.Bytes(),
				CPUMillis:   w.Resources.CPULimit.Millis(),
				Pids:        int64(w.Resources.PidsLimit),
			},
		},
		Runtimes: a.placements.Unavailable(),
		Networks: networks,
		NoEgress: a.placements.NoEgress(),
		Images:   orchestrator.Images{Default: w.AICoderImage, Allowed: w.AllowedImages},
		Sessions: a.sessions,
		Exec: orchestrator.Exec{
			Disabled:       !cfg.Execution.Enabled,
			DefaultImage:   cfg.Execution.DefaultImage,
			AllowedImages:  cfg.Execution.AllowedImages,
			DefaultTimeout: time.Duration(cfg.Execution.Timeout) * time.Second,
			MaxOutputBytes: cfg.Execution.MaxOutputSize.Bytes(),
			MaxMemoryBytes: cfg.Execution.MaxMemory.Bytes(),
			NetworkEnabled: cfg.Execution.NetworkEnabled,
		},
		Agents:           agentConfigs(cfg),
		AgentMissing:     agentMissing,
		AgentCredentials: agentNoCredentials,
		CheckAllow:       a.checkAllow,
		Credentials:      a.onRequestCredentials(),
		NetworkChanged:   func(t task.Task) { a.runner.ApplyEgress(t) },
		Admit:            func(spec task.Spec) (eventstore.Proposed, func(), bool) { return a.sched.Admit(spec) },
	}, a.log.With("subsystem", "orchestrator"))
	a.runner = taskrun.New(taskrun.Options{
		Store:    a.store,
		Tasks:    a.tasks,
		Data:     a.data,
		Projects: projects,
		Agents:   agentConfigs(cfg),
		Worker: taskrun.WorkerOptions{
			BinDir:     binDir,
			SocketDir:  sockDir,
			Replica:    a.members.Self(),
			Secret:     secret,
			Placements: a.placements,
		},
		Sessions:        a.sessions,
		Verifier:        webhook.NewVerifier(secret, time.Duration(lim.WebhookMaxSkew), nil),
		Egress:          a.egressProxies(),
		MaxLogBytes:     lim.MaxLogBytes.Bytes(),
		MaxTaskDirBytes: lim.MaxTaskDirBytes.Bytes(),
		AllowHooks:      cfg.Workspaces.AllowHooks,
	}, a.log.With("subsystem", "taskrun"))
	a.sched = scheduler.New(scheduler.Options{
		Writers:       writers,
		MaxConcurrent: w.MaxConcurrentWorkers,
		StopGrace:     time.Duration(lim.StopGrace),
		Runtimes:      a.placements.Sandboxes(),
		Members:       a.members,
		Runner:        a.runner,
		Quota:         dirQuota,
		Crash:         crashHook(cfg.CrashAt, a.log),
	}, a.tasks, a.store, a.log.With("subsystem", "scheduler"))
	var deliveries httpapi.Deliveries
	if n := cfg.Notify; n.URL != "" {
		var previous []string
		if secrets.NotifyPreviousSecret != nil {
			previous = append(previous, string(secrets.NotifyPreviousSecret))
		}
		signer, err := notify.NewSigner(string(secrets.NotifySecret), previous...)
		if err != nil {
			return &errdefs.FieldError{Field: "notify.secret_file", Err: err}
		}
		a.notifier, err = notify.New(a.store, notify.Options{
			URL:            n.URL,
			Signer:         signer,
			Events:         n.Events,
			MaxAttempts:    n.MaxAttempts,
			InitialBackoff: time.Duration(n.InitialBackoff),
			MaxBackoff:     time.Duration(n.MaxBackoff),
			Timeout:        time.Duration(n.Timeout),
			Concurrency:    n.Concurrency,
			Delivered:      crashAt(crashHook(cfg.CrashAt, a.log), sandbox.CrashDelivered),
		}, a.log.With("subsystem", "notify"))
		if err != nil {
			return err
		}
		deliveries = notifyDeliveries{a.notifier}
	}
	toolLimits := tools.Limits{DefaultTimeoutMinutes: w.DefaultTimeoutMinutes, MaxTimeoutMinutes: w.MaxTimeoutMinutes, NoCodeExecute: !cfg.Execution.Enabled}
	mcpSrv := mcpserver.New(a.Services(), mcpserver.Options{MaxArgumentBytes: lim.MaxRequestBytes.Bytes(), Version: version.String(), Limits: toolLimits}, a.log.With("subsystem", "mcp"))
	a.api = httpapi.New(a.Services(), backend{a}, httpapi.Options{
		Token:           a.token,
		Tokens:          tokens,
		Deliveries:      deliveries,
		SessionGate:     a.sessions,
		WarmGate:        a.warmGate(),
		MaxRequestBytes: lim.MaxRequestBytes.Bytes(),
		MCP:             mcpSrv.Handler(),
		Listen:          cfg.Listen,
		AllowedHosts:    cfg.HTTP.AllowedHosts,
		AllowedOrigins:  cfg.HTTP.AllowedOrigins,
		Ready:           a.sched.Reconciled(),
		ToolLimits:      toolLimits,
		Version:         version.String(),
		Revision:        version.Revision(),
		Replica:         a.members.Self(),
		Holding:         a.members.Holding,
		Doctor: (&doctorCache{ttl: time.Minute, run: func(ctx context.Context) []Check {
			return Doctor(ctx, cfg, slog.New(slog.DiscardHandler))
		}}).checks,
		// The multipart framing adds a little to the files' own bytes.
		MaxUploadRequestBytes: lim.MaxUploadRequestBytes.Bytes() + 64<<10,
		RateLimit:             httpapi.RateLimit{Rate: lim.APIRate, Burst: lim.APIBurst},
	}, a.log.With("subsystem", "http"))

	return a.listenSockets()
}

// advertiseURL is where the other replicas reach the API listening on
// addr: its address, or, when it listens on every address of the host,
// the host's first address that is not a loopback one (a pod's IP, in a
// cluster).
func advertiseURL(addr net.Addr) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "localhost"
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if n, ok := a.(*net.IPNet); ok && n.IP.IsGlobalUnicast() {
					host = n.IP.String()
					break
				}
			}
		}
	}
	return "http://" + net.JoinHostPort(host, port)
}

// join makes this server a replica of the cluster on its store (alone on
// SQLite), offering the runtimes that take work.
func (a *App) join(ctx context.Context) error {
	self := cluster.Replica{ID: cluster.NewID(), Started: time.Now(), URL: advertiseURL(a.ln.Addr())}
	self.Host, _ = os.Hostname()
	for _, name := range slices.Sorted(maps.Keys(a.placements.Sandboxes())) {
		if a.placements.Usable(name) != nil {
			self.Runtimes = append(self.Runtimes, name)
		}
	}
	if a.pg == nil {
		a.members = cluster.NewSolo(self)
		return nil
	}
	m, err := a.pg.Join(ctx, self)
	if err != nil {
		return err
	}
	a.members = m
	a.log.Info("joined the cluster", "replica", self.ID, "live", len(m.Live()))
	return nil
}

// taskQuota holds task directories to limits.max_task_dir_bytes: in the
// kernel where the data root's filesystem has project quotas, else polled.
func (a *App) taskQuota() *taskrun.TaskQuota {
	projects, err := quota.Open(a.data.HostPath(workspace.DirTasks))
	q := taskrun.NewTaskQuota(a.data, a.cfg.Limits.MaxTaskDirBytes.Bytes(), a.cfg.Limits.MinFreeDisk.Bytes(), projects, a.log.With("subsystem", "quota"))
	if err != nil {
		a.log.Warn("task quota "+q.Mode(), "reason", err)
	} else {
		a.log.Info("task quota " + q.Mode())
	}
	return q
}

// sessionQuota holds sessions' own directories to the task directories'
// quota.
type sessionQuota struct{ q *taskrun.TaskQuota }

func sessionDir(id, rel string) taskrun.QuotaDir {
	return taskrun.QuotaDir{Key: id, Rel: rel, Noun: "session directory"}
}

func (s sessionQuota) Limit(ctx context.Context, id, rel string) error {
	return s.q.LimitDir(ctx, sessionDir(id, rel))
}

func (s sessionQuota) Check(ctx context.Context, id, rel string) (time.Duration, error) {
	return s.q.CheckDir(ctx, sessionDir(id, rel))
}

func (s sessionQuota) Release(ctx context.Context, id, rel string) {
	s.q.ReleaseDir(ctx, sessionDir(id, rel))
}

// generatedSecret returns the webhook secret kept in the data root, making
// it on first start. It must survive restarts: running workers hold keys
// derived from it.
func (a *App) generatedSecret() ([]byte, error) {
	p := a.data.HostPath(workspace.DirRun, "webhook.key")
	b, err := os.ReadFile(p)
	if err == nil && len(b) >= 32 {
		return b, nil
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read webhook key: %w", err)
	}
	b = make([]byte, 32)
	rand.Read(b)
	if err := workspace.WriteFileAtomic(a.data.Root(), workspace.DirRun+"/webhook.key", b, 0o600); err != nil {
		return nil, fmt.Errorf("write webhook key: %w", err)
	}
	return b, nil
}

// openStore opens the configured event store: SQLite in the data root, or
// PostgreSQL, which several servers (replicas) share.
func (a *App) openStore(ctx context.Context, dsn string) error {
	log := a.log.With("subsystem", "eventstore")
	db := filepath.Join(a.data.Path(), "corral.db")
	if a.cfg.Store.Driver == config.StorePostgres {
		// SQLite's lock file (sqlite.Open takes it alone), which the
		// replicas on PostgreSQL share: they may share a data root, but
		// never with a server on SQLite.
		var err error
		if a.rootLock, err = lockfile.AcquireShared(db + ".lock"); err != nil {
			return err
		}
		store, err := postgres.Open(ctx, dsn, log)
		if err != nil {
			return err
		}
		// PostgreSQL counts its own commits (pg_stat_database); /metrics
		// has none of them.
		a.store, a.pg, a.commits = store, store, func() sqlite.CommitStats { return sqlite.CommitStats{} }
		return nil
	}
	store, err := sqlite.Open(ctx, db, log)
	if err != nil {
		return err
	}
	a.store, a.commits = store, store.Commits
	return nil
}

// Addr returns the address the HTTP API listens on.
func (a *App) Addr() string { return a.ln.Addr().String() }

// Token returns the API bearer token ("" when none is configured).
func (a *App) Token() string { return a.token }

// Services returns the server's use cases, for a caller in the same
// process (corral mcp with an embedded server, the tests).
func (a *App) Services() service.Set {
	return service.Set{Tasks: a.orch, Library: a.lib, Sessions: replicaSessions{Manager: a.sessions, self: a.members.Self(), token: a.replicaToken}}
}

// Run serves the API and runs the scheduler until ctx is done, then shuts
// down. Workers keep running and the next start reattaches to them,
// unless the configuration says shutdown: stop (stopAll). A Run that ends
// on an error of its own leaves them either way, as a crash does.
func (a *App) Run(parent context.Context) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	// Headers within 10 s, a body that never stalls for 30 s (httpapi), and
	// an idle keep-alive connection closed after 2 minutes: a client that
	// opens connections and sends nothing cannot hold them.
	srv := &http.Server{Handler: a.api.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	sockSrv := &http.Server{Handler: a.api.WebhookHandler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	errc := make(chan error, 8)
	var wg sync.WaitGroup
	run := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil {
				errc <- err
				cancel()
			}
		}()
	}
	run(func() error { return a.tasks.Run(ctx) })
	run(func() error { return a.sched.Run(ctx) })
	run(func() error { return a.runner.RunEgress(ctx) })
	a.keepWarm(ctx, run)
	run(func() error { return a.egressRec.Run(ctx) })
	if a.notifier != nil {
		run(func() error { return a.notifier.Run(ctx) }) // every replica lists the deliveries
	}
	run(func() error {
		a.members.Lead(ctx, func(ctx context.Context) {
			if err := a.lead(ctx); err != nil {
				errc <- err
				cancel()
			}
		})
		return nil
	})
	if err := a.sessions.Start(ctx); err != nil {
		cancel()
		wg.Wait()
		return err
	}
	run(func() error { return a.sessions.Follow(ctx) })
	run(func() error { return a.sessions.Reap(ctx) })
	run(func() error { return ignoreClosed(srv.Serve(a.ln)) })
	run(func() error { return ignoreClosed(sockSrv.Serve(a.sockets.own)) })
	run(func() error { return a.serveShared(ctx, sockSrv) })
	if a.egressLn != nil {
		run(func() error { return a.egress.ServeTCP(a.egressLn, a.egressKey, a.egressProven) })
	}
	a.log.Info("corral serving", "addr", a.Addr(), "data", a.data.Path(), "runtime", a.cfg.Runtime)
	<-ctx.Done()
	if a.egressLn != nil {
		a.egressLn.Close()
	}
	a.egress.Shutdown() // the directories stay: running sandboxes keep them mounted
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	srv.Shutdown(sctx)
	sockSrv.Shutdown(sctx)
	wg.Wait()
	if a.cfg.Shutdown == config.ShutdownStop && parent.Err() != nil {
		a.stopAll(parent)
	}
	close(errc)
	return <-errc
}

// stopSlack is what stopAll allows beyond limits.stop_grace: to record
// the ends and destroy what is left of the sandboxes.
const stopSlack = 10 * time.Second

// stopAll ends, once Run's parts have returned, every task and session
// this replica runs, and stops and destroys their sandboxes, for a server
// configured with shutdown: stop. Warm sandboxes are gone already: their
// pools destroy them when Run's context ends. It takes limits.stop_grace
// and stopSlack at most; what is left then (an end the store did not
// take, a sandbox that would not go) the next start reattaches or ends,
// as after a crash. Nothing is handed over to another replica: the
// replica's lease lasts until the store closes, after Run.
func (a *App) stopAll(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Duration(a.cfg.Limits.StopGrace)+stopSlack)
	defer cancel()
	a.log.Info("stopping every task and session (shutdown: stop)")
	var wg sync.WaitGroup
	wg.Go(func() { a.sched.StopAll(ctx) })
	wg.Go(func() { a.sessions.StopAll(ctx) })
	wg.Wait()
	if ctx.Err() != nil {
		a.log.Warn("shutdown: stop ran out of time; the next start ends or reattaches what is left")
	}
}

func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// lead does, until ctx ends, what one replica of the cluster does for all
// (cluster.Members.Lead): the scheduler's assignment of queued tasks, the
// projection's checkpoints, webhook deliveries (or the record that they
// are off), the copies and reports that follow a task's end, and
// retention. Each picks up from the
// log where the last leader left off.
func (a *App) lead(ctx context.Context) error {
	var wg sync.WaitGroup
	errc := make(chan error, 6)
	run := func(f func() error) {
		wg.Go(func() {
			if err := f(); err != nil {
				errc <- err
			}
		})
	}
	run(func() error { a.sched.Lead(ctx); return nil })
	// One replica saves the projection's checkpoints for all (each would
	// rewrite the same archive), and one more as it stops.
	run(func() error { return a.tasks.KeepCheckpoints(ctx) })
	run(func() error { return a.lib.RunRetention(ctx) })
	run(func() error { return a.lib.RunSaves(ctx) })
	run(func() error { return report.Run(ctx, a.store, a.log.With("subsystem", "report")) })
	if a.notifier != nil {
		run(func() error { return a.notifier.Send(ctx) })
	} else if err := notify.Disable(ctx, a.store); err != nil {
		a.log.Warn("cannot record notifications off", "err", err)
	}
	wg.Wait()
	close(errc)
	return <-errc
}

// Close releases the store, the data root, the listeners and the runtimes
// that hold something (a client, a thread).
func (a *App) Close() error {
	for _, rt := range a.placements.Sandboxes() {
		if c, ok := rt.(io.Closer); ok {
			c.Close()
		}
	}
	if a.egress != nil {
		a.egress.Shutdown()
	}
	for _, l := range []net.Listener{a.ln, a.sockets.own, a.sockets.shared, a.egressLn} {
		if l != nil {
			l.Close()
		}
	}
	a.closeDocuments()
	if a.store != nil {
		a.store.Close()
	}
	a.rootLock.Release() // nil-safe
	a.sockets.lock.Release()
	if a.attRoot != nil {
		a.attRoot.Close()
	}
	if a.data != nil {
		a.data.Close()
	}
	return nil
}

// backend is httpapi's server-only operations.
type backend struct{ a *App }

// OpenOutput opens a task's output file, for its download.
func (b backend) OpenOutput(ctx context.Context, id, path string) (*os.File, fs.FileInfo, error) {
	return b.a.lib.OpenOutput(ctx, id, path)
}

func (b backend) OpenShared(ctx context.Context, path string) (*os.File, fs.FileInfo, error) {
	return b.a.lib.OpenShared(ctx, path)
}

// WorkerComplete and WorkerProgress are the workers' webhooks, which the
// task runner takes.
func (b backend) WorkerComplete(ctx context.Context, m webhook.Signed) (string, error) {
	return b.a.runner.WorkerComplete(ctx, m)
}

func (b backend) WorkerProgress(ctx context.Context, m webhook.Signed) (int, error) {
	return b.a.runner.WorkerProgress(ctx, m)
}

func (b backend) Stats() httpapi.Stats {
	st := httpapi.Stats{ByStatus: b.a.tasks.Counts(), Running: b.a.sched.Running(), Warm: b.a.WarmStats()}
	st.QueueDepth = st.ByStatus[task.Queued] + st.ByStatus[task.Pending]
	e := b.a.tasks.Ended()
	st.Durations = httpapi.Histogram{Bounds: projection.DurationBuckets, Within: e.Within, Count: e.Timed, Sum: e.Seconds}
	c := b.a.Commits()
	st.Commits = httpapi.Histogram{Bounds: sqlite.CommitBuckets, Within: c.Within, Count: c.Commits, Sum: c.Seconds}
	st.EventsCommitted = c.Events
	st.Agents = make(map[string]httpapi.AgentUsage, len(e.Agents))
	for name, u := range e.Agents {
		st.Agents[name] = httpapi.AgentUsage(u)
	}
	if b.a.notifier != nil {
		d := httpapi.DeliveryStats(b.a.notifier.Stats())
		st.Deliveries = &d
	}
	return st
}

// Commits are the event log's commits since the server started.
func (a *App) Commits() sqlite.CommitStats { return a.commits() }

// notifyDeliveries serves /api/deliveries from the dispatcher, recording the
// caller as the actor of a retry.
type notifyDeliveries struct{ d *notify.Dispatcher }

func (n notifyDeliveries) List(ctx context.Context, state task.DeliveryState, limit int) ([]task.Delivery, error) {
	return n.d.List(ctx, state, limit)
}

func (n notifyDeliveries) Retry(ctx context.Context, id string) (task.Delivery, error) {
	return n.d.Retry(ctx, id, service.ActorFrom(ctx))
}
