package app

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/corral-dev/corral/internal/agent"
	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/egress"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/session"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/taskrun"
	"github.com/corral-dev/corral/internal/webhook"
	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/corral-dev/corral/internal/workspace"
)

// egressActor is the actor of egress_connection events.
const egressActor = "corral/egress"

// egressBuffer is how many egress records may wait for the event store.
// A record is a few hundred bytes; a worker opening connections faster
// than the store appends them (thousands a second) loses records, counted
// and logged, rather than slowing its own connections.
const egressBuffer = 4096

// egressProxies is the orchestrator's Egress over an egress.Server: it
// turns a task's network policy into an egress.Policy.
type egressProxies struct {
	srv   *egress.Server
	allow []egress.Rule
	// creds are the credential rules (egress.credentials); ca, the DER of
	// the CA the proxy intercepts their hosts under (nil without rules).
	creds []configuredCredential
	ca    []byte
}

// configuredCredential is a credential rule and whether it is given only
// on request.
type configuredCredential struct {
	egress.Credential
	onRequest bool
	// placeholderEnv is a variable the sandbox gets with a placeholder,
	// for a program that insists on one.
	placeholderEnv string
}

func (e egressProxies) Open(id string, p taskrun.EgressPolicy) (string, error) {
	if p.Network == "" || p.Network == task.NetworkNone {
		return "", fmt.Errorf("network %q has no egress proxy", p.Network)
	}
	pol, err := e.policy(p)
	if err != nil {
		return "", err
	}
	return e.srv.Open(id, pol)
}

func (e egressProxies) Update(id string, p taskrun.EgressPolicy) error {
	pol, err := e.policy(p)
	if err != nil {
		return err
	}
	return e.srv.SetPolicy(id, pol)
}

// policy is the egress.Policy of p: none lets nothing through, not even
// the model APIs; a task's own allowlist replaces the server's.
func (e egressProxies) policy(p taskrun.EgressPolicy) (egress.Policy, error) {
	var pol egress.Policy
	switch egress.Mode(p.Network) {
	case egress.ModeNone:
		return pol, nil
	case egress.ModeAllowlist:
	case egress.ModeOpen:
		pol.Open = true
	default:
		return pol, fmt.Errorf("network %q is not an egress policy", p.Network)
	}
	pol.Allow = e.allow
	if p.Allow != nil {
		rules, err := egress.ParseRules(p.Allow)
		if err != nil {
			return pol, err
		}
		pol.Allow = rules
	}
	models, err := egressModels(p.Models)
	if err != nil {
		return pol, err
	}
	pol.Models = models
	pol.Credentials = credentialsFor(e.creds, p.Credentials)
	return pol, nil
}

// credentialsFor are the rules a task or session that asked for names
// gets: those for every one, and those on request that it named.
func credentialsFor(rules []configuredCredential, names []string) []egress.Credential {
	var out []egress.Credential
	for _, r := range filterCredentials(rules, names) {
		out = append(out, r.Credential)
	}
	return out
}

func filterCredentials(rules []configuredCredential, names []string) []configuredCredential {
	var out []configuredCredential
	for _, r := range rules {
		if !r.onRequest || slices.Contains(names, r.Name) {
			out = append(out, r)
		}
	}
	return out
}

// SandboxEnv is what the sandbox of a task or session under p needs in
// its environment: the proxy's CA, when it intercepts any host, and the
// placeholders of its credential rules' variables.
func (e egressProxies) SandboxEnv(p taskrun.EgressPolicy) []string {
	if len(e.ca) == 0 || p.Network == "" || p.Network == task.NetworkNone {
		return nil
	}
	env := []string{workerproto.EnvEgressCA + "=" + base64.StdEncoding.EncodeToString(e.ca)}
	for _, r := range filterCredentials(e.creds, p.Credentials) {
		if r.placeholderEnv != "" {
			env = append(env, r.placeholderEnv+"="+agent.KeyPlaceholder)
		}
	}
	return env
}

// checkAllow checks a task's or a session's own allowlist: entries the
// proxy reads, each within the server's list unless hosts may be added
// (egress.task_hosts).
func (a *App) checkAllow(entries []string) error {
	rules, err := egress.ParseRules(entries)
	if err != nil {
		return err
	}
	if a.cfg.Egress.TaskHosts == config.TaskHostsAdd {
		return nil
	}
	server := egress.Policy{Allow: a.egressAllow}
	var outside []string
	for _, r := range rules {
		if !server.Covers(r) {
			outside = append(outside, r.String())
		}
	}
	if len(outside) > 0 {
		return fmt.Errorf("%s: not within the server's egress.allow, and egress.task_hosts is narrow", strings.Join(outside, ", "))
	}
	return nil
}

// egressModels are the egress's model APIs for apis; a base URL the
// configuration names that is not one is refused.
func egressModels(apis []workerproto.ModelAPI) ([]egress.Model, error) {
	var models []egress.Model
	for _, a := range apis {
		m, err := egress.ParseModel(a.Base, a.Header, a.Value)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", a.BaseURLVar, err)
		}
		m.Placeholder = agent.KeyPlaceholder
		models = append(models, m)
	}
	return models, nil
}

// sessionEgress is a session's view of the proxies: a session runs no
// agent, so its proxy relays no model API; it gets the credential rules
// given to every task and session. Its pod proves itself to the egress
// listener with a key derived from secret (egress.SessionKey).
type sessionEgress struct {
	egressProxies
	secret []byte
}

func (e sessionEgress) Key(id string) []byte { return egress.SessionKey(e.secret, id) }

func (e sessionEgress) Open(id, network string, allow []string) (string, error) {
	return e.egressProxies.Open(id, taskrun.EgressPolicy{Network: network, Allow: allow})
}

func (e sessionEgress) Update(id, network string, allow []string) error {
	return e.egressProxies.Update(id, taskrun.EgressPolicy{Network: network, Allow: allow})
}

func (e sessionEgress) SandboxEnv(network string) []string {
	return e.egressProxies.SandboxEnv(taskrun.EgressPolicy{Network: network})
}

func (e egressProxies) Dir(id string) string     { return e.srv.Dir(id) }
func (e egressProxies) Close(id string) error    { return e.srv.Close(id) }
func (e egressProxies) Tasks() ([]string, error) { return e.srv.Tasks() }
func (e egressProxies) Forwards() []string       { return egress.LoopbackForwards(e.allow) }

// egressRecorder appends each egress.Record to its task's stream as an
// egress_connection event. Add never blocks the proxy: records go through
// a buffer to one appender, and a full buffer drops the record and counts
// it.
type egressRecorder struct {
	store   eventstore.Store
	tasks   *projection.Tasks
	log     *slog.Logger
	ch      chan egress.Record
	dropped atomic.Int64
}

func newEgressRecorder(store eventstore.Store, tasks *projection.Tasks, log *slog.Logger) *egressRecorder {
	return &egressRecorder{store: store, tasks: tasks, log: log, ch: make(chan egress.Record, egressBuffer)}
}

// Add queues rec, or drops it if the buffer is full.
func (r *egressRecorder) Add(rec egress.Record) {
	select {
	case r.ch <- rec:
	default:
		r.dropped.Add(1)
	}
}

// Run appends queued records until ctx ends, then what is left for up to
// two seconds. Drops are logged at most every ten seconds.
func (r *egressRecorder) Run(ctx context.Context) error {
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	var reported int64
	report := func() {
		if n := r.dropped.Load(); n != reported {
			r.log.Warn("egress events dropped: the event store is slower than the proxy", "dropped_total", n)
			reported = n
		}
	}
	for {
		select {
		case rec := <-r.ch:
			r.append(ctx, rec)
		case <-tick.C:
			report()
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer cancel()
			for dctx.Err() == nil {
				select {
				case rec := <-r.ch:
					r.append(dctx, rec)
				default:
					report()
					return nil
				}
			}
			report()
			return nil
		}
	}
}

func (r *egressRecorder) append(ctx context.Context, rec egress.Record) {
	ev := projection.NewEvent(task.EventEgressConnection, task.EgressConnection{
		Method:          rec.Method,
		Host:            rec.Host,
		Port:            rec.Port,
		Path:            rec.Path,
		Credential:      rec.Credential,
		Address:         rec.Address,
		Allowed:         rec.Allowed,
		Reason:          rec.Reason,
		Error:           rec.Error,
		Status:          rec.Status,
		BytesUp:         rec.BytesUp,
		BytesDown:       rec.BytesDown,
		DurationSeconds: math.Round(rec.Duration.Seconds()*1000) / 1000,
	}, egressActor)
	stream := task.StreamID(rec.TaskID)
	if session.ValidID(rec.TaskID) {
		stream = session.StreamID(rec.TaskID)
	} else if t, err := r.tasks.Get(rec.TaskID); err == nil {
		ctx = projection.TaskCause(ctx, t)
	}
	if _, err := r.store.Append(ctx, stream, eventstore.AnyVersion, ev); err != nil && ctx.Err() == nil {
		r.log.Warn("cannot record egress connection", logkey.TaskID, rec.TaskID, logkey.Error, err)
	}
}

// openEgress builds the egress proxies' server over run/egress and the
// recorder of their connections. With credential rules, the proxy's CA is
// kept in run/egress-ca, which no sandbox mounts.
func (a *App) openEgress(secrets config.Secrets) error {
	allow, err := egress.ParseRules(a.cfg.Egress.Allow)
	if err != nil {
		return fmt.Errorf("egress.allow: %w", err)
	}
	a.egressAllow = allow
	opts := egress.Options{}
	for i, c := range a.cfg.Egress.Credentials {
		header := c.Header
		if header == "" {
			header = "Authorization"
		}
		cred, err := egress.ParseCredential(c.Name, c.Host, c.PathPrefix, header, secrets.EgressCredentials[i])
		if err != nil {
			return fmt.Errorf("egress.credentials[%d]: %w", i, err)
		}
		a.egressCreds = append(a.egressCreds, configuredCredential{Credential: cred, onRequest: c.OnRequest, placeholderEnv: c.PlaceholderEnv})
	}
	if len(a.egressCreds) > 0 {
		ca, err := egress.LoadCA(a.data.HostPath(workspace.DirRun, "egress-ca"))
		if err != nil {
			return err
		}
		opts.CA, a.egressCA = ca, ca.CertDER()
	}
	if f := a.cfg.Egress.UpstreamCAFile; f != "" {
		if opts.RootCAs, err = upstreamRoots(f); err != nil {
			return fmt.Errorf("egress.upstream_ca_file: %w", err)
		}
	}
	log := a.log.With(logkey.Subsystem, "egress")
	a.egressRec = newEgressRecorder(a.store, a.tasks, log)
	opts.OnConnection = a.egressRec.Add
	a.egress, err = egress.NewServer(a.data.HostPath(workspace.DirRun, "egress"), opts, log)
	return err
}

// upstreamRoots are the system's roots and the certificates in file.
func upstreamRoots(file string) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return pool, nil
}

// listenEgress listens for the egress of worker pods on
// kubernetes.egress_listen and returns where pods reach it ("" when it is
// not set: tasks and sessions there run with network none). A pod proves
// its task with the task's webhook key, derived from secret; a session's
// pod proves its session with the session's own (session.Manager.EgressKey).
func (a *App) listenEgress(secret []byte) (string, error) {
	k := a.cfg.Kubernetes
	if k.EgressListen == "" {
		return "", nil
	}
	ln, err := net.Listen("tcp", k.EgressListen)
	if err != nil {
		return "", fmt.Errorf("kubernetes.egress_listen: %w", err)
	}
	a.egressLn = ln
	a.egressKey = func(id string) []byte {
		if session.ValidID(id) {
			return a.sessions.EgressKey(id)
		}
		return webhook.DeriveKey(secret, id)
	}
	// Pods reach any replica behind the Service: one that did not start
	// the task opens its proxy here too (Open keeps one that runs), once
	// the pod has proved the task's key.
	a.egressProven = func(id string) {
		if session.ValidID(id) {
			return
		}
		if t, err := a.tasks.Get(id); err == nil && !t.Status.Terminal() && t.Network != "" && t.Network != task.NetworkNone {
			if err := a.runner.OpenEgress(t); err != nil {
				a.log.Warn("cannot open a task's egress proxy for its pod", logkey.TaskID, id, logkey.Error, err)
			}
		}
	}
	addr := k.EgressAddr
	if addr == "" {
		u, err := url.Parse(k.ServerURL)
		if err != nil {
			return "", fmt.Errorf("kubernetes.server_url: %w", err)
		}
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		addr = net.JoinHostPort(u.Hostname(), port)
	}
	return addr, nil
}

// egressProxies is the orchestrator's and the sessions' view of the
// egress server.
func (a *App) egressProxies() egressProxies {
	return egressProxies{srv: a.egress, allow: a.egressAllow, creds: a.egressCreds, ca: a.egressCA}
}

// onRequestCredentials name the credential rules a task asks for.
func (a *App) onRequestCredentials() []string {
	var names []string
	for _, c := range a.egressCreds {
		if c.onRequest {
			names = append(names, c.Name)
		}
	}
	return names
}
