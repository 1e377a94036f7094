package session

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore/sqlite/sqlitetest"
	"github.com/corral-dev/corral/internal/placement"
	"github.com/corral-dev/corral/internal/rtkind"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/sandboxtest"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/corral-dev/corral/internal/workspace"
)

// fakeEgress records what the manager has its proxies do.
type fakeEgress struct {
	dir     string
	mu      sync.Mutex
	open    map[string]string // id -> network
	updates []string
}

func (f *fakeEgress) Open(id, network string, _ []string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.open[id]; !ok {
		f.open[id] = network
	}
	return f.dir + "/run/egress/" + id, nil
}

func (f *fakeEgress) Update(id, network string, _ []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.open[id] = network
	f.updates = append(f.updates, id+" "+network)
	return nil
}

func (f *fakeEgress) Close(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.open, id)
	return nil
}

func (f *fakeEgress) SandboxEnv(string) []string { return nil }
func (f *fakeEgress) Key(id string) []byte       { return []byte("key of " + id) }

func (f *fakeEgress) isOpen(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.open[id]
	return ok
}

// remoteManager is a Manager of replica r-self (r-other alive beside it)
// with a remote runtime (kubernetes) whose pods reach the egress listener
// at 10.0.0.1:7778, and a host one (local).
func remoteManager(t *testing.T) (*Manager, *fakeEgress, *sandboxtest.Fake) {
	t.Helper()
	data, err := workspace.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	fake := sandboxtest.NewFake()
	fake.Run = func(ctx context.Context, _ sandbox.Spec) sandbox.ExitStatus {
		<-ctx.Done()
		return sandbox.ExitStatus{Code: 143}
	}
	t.Cleanup(func() {
		for _, h := range fake.Created() {
			fake.Destroy(context.Background(), h.ID)
		}
	})
	k8s, _ := rtkind.Of(rtkind.Kubernetes)
	local, _ := rtkind.Of(rtkind.Local)
	eg := &fakeEgress{dir: data.Path(), open: map[string]string{}}
	m := New(Options{
		Store: sqlitetest.Open(t),
		Data:  data,
		Placements: placement.NewSet(
			&placement.Runtime{Kind: k8s, Sandbox: fake, ServerURL: "http://10.0.0.1:7777", EgressAddr: "10.0.0.1:7778"},
			&placement.Runtime{Kind: local, Sandbox: fake}),
		Base:    placement.Base{BinDir: "run/bin", SocketDir: "run/sock"},
		Egress:  eg,
		Members: twoReplicas{Solo: cluster.NewSolo(cluster.Replica{ID: "r-self"}), other: "r-other"},
	}, slog.New(slog.DiscardHandler))
	return m, eg, fake
}

// A session's pod on a remote runtime gets the egress listener's address
// and the session's own key in its environment, and no socket to mount;
// a host sandbox the socket's directory, and no key.
func TestSessionEgressOfAPod(t *testing.T) {
	m, _, fake := remoteManager(t)
	ctx := context.Background()
	for _, rt := range []string{rtkind.Kubernetes, rtkind.Local} {
		id := "sess-01m8jbh60d7qh1g11cxcbgpm" + map[string]string{rtkind.Kubernetes: "k0", rtkind.Local: "l0"}[rt]
		p := m.opts.Placements.Usable(rt)
		if _, _, err := m.startSandbox(ctx, p, sandboxOf{id: id, network: task.NetworkAllowlist, dir: ownDir(id)}); err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(fake.Created(), func(s sandbox.Spec) bool { return s.ID == id })
		spec := fake.Created()[i]
		env := strings.Join(spec.Env, "\n") + "\n"
		mounted := slices.ContainsFunc(spec.Mounts, func(mt sandbox.Mount) bool { return mt.Target == workerproto.EgressDir })
		key := workerproto.EnvSessionEgressKey + "=" + hex.EncodeToString([]byte("key of "+id)) + "\n"
		if spec.Network != sandbox.NetworkEgress || !strings.Contains(env, workerproto.EnvSessionEgress+"=1\n") {
			t.Errorf("%s: network %q, env %q; want egress", rt, spec.Network, spec.Env)
		}
		if rt == rtkind.Kubernetes && (!strings.Contains(env, workerproto.EnvSessionEgressAddr+"=10.0.0.1:7778\n") || !strings.Contains(env, key) || mounted) {
			t.Errorf("a pod's env %q, egress mounted %v; want the listener's address and the session's key, no mount", spec.Env, mounted)
		}
		if rt == rtkind.Local && (strings.Contains(env, workerproto.EnvSessionEgressKey) || strings.Contains(env, workerproto.EnvSessionEgressAddr) || !mounted) {
			t.Errorf("a host sandbox's env %q, egress mounted %v; want the socket mounted and no key", spec.Env, mounted)
		}
	}
}

// The egress listener gets a session's key only while the session runs
// on a remote runtime with a network. A replica that does not run it
// opens its proxy for its pod, keeps that proxy to the session's policy
// and closes it once the session ends; then the key is refused.
func TestSessionEgressKey(t *testing.T) {
	m, eg, _ := remoteManager(t)
	ctx := context.Background()
	record := func(id, rt, network, replica string) {
		t.Helper()
		c := created{Session: Session{ID: id, Status: StatusRunning, Runtime: rt, Network: network}, TokenHash: hashToken(newToken()), AgentTokenHash: hashToken(newToken()), Replica: replica}
		if err := m.append(ctx, id, EventCreated, c); err != nil {
			t.Fatal(err)
		}
	}
	const (
		elsewhere = "sess-01m8jbh60d7qh1g11cxcbgpmz0"
		here      = "sess-01m8jbh60d7qh1g11cxcbgpmz1"
		none      = "sess-01m8jbh60d7qh1g11cxcbgpmz2"
		onHost    = "sess-01m8jbh60d7qh1g11cxcbgpmz3"
		unknown   = "sess-01m8jbh60d7qh1g11cxcbgpmz4"
	)
	record(elsewhere, rtkind.Kubernetes, task.NetworkAllowlist, "r-other")
	record(here, rtkind.Kubernetes, task.NetworkOpen, "r-self")
	record(none, rtkind.Kubernetes, task.NetworkNone, "r-other")
	record(onHost, rtkind.Local, task.NetworkAllowlist, "r-other")
	for _, id := range []string{none, onHost, unknown, "task-x"} {
		if k := m.EgressKey(id); k != nil {
			t.Errorf("%s: key %q, want none", id, k)
		}
	}
	if eg.isOpen(onHost) || eg.isOpen(none) {
		t.Errorf("a proxy opened for a session without a network or on a host runtime")
	}
	if k := m.EgressKey(here); !bytes.Equal(k, []byte("key of "+here)) || eg.isOpen(here) {
		t.Errorf("the key of a session run here: %q, a proxy lent %v; want the key, and its own proxy (opened at its start) alone", k, eg.isOpen(here))
	}
	if k := m.EgressKey(elsewhere); !bytes.Equal(k, []byte("key of "+elsewhere)) || !eg.isOpen(elsewhere) {
		t.Fatalf("the key of a session another replica runs: %q, its proxy open here %v; want both", k, eg.isOpen(elsewhere))
	}
	// Its policy changed (by the replica that runs it): the lent proxy
	// follows.
	if err := m.append(ctx, elsewhere, EventNetworkChanged, task.NetworkChanged{Network: task.NetworkOpen}); err != nil {
		t.Fatal(err)
	}
	m.followNetwork(ctx)
	if !slices.Contains(eg.updates, elsewhere+" "+task.NetworkOpen) {
		t.Errorf("the lent proxy's updates: %v, want the new policy", eg.updates)
	}
	// Ended: the lent proxy closes, the key is refused.
	if err := m.append(ctx, elsewhere, EventEnded, map[string]string{"reason": "deleted"}); err != nil {
		t.Fatal(err)
	}
	m.closeLent()
	if eg.isOpen(elsewhere) {
		t.Errorf("the proxy lent to an ended session is still open")
	}
	if k := m.EgressKey(elsewhere); k != nil || eg.isOpen(elsewhere) {
		t.Errorf("an ended session's key: %q, proxy open %v; want neither", k, eg.isOpen(elsewhere))
	}
}

// A sandbox the runtime cannot start (an engine's refusal) is the
// caller's to read, as a task's start failure is: unavailable, saying
// why, not an internal error whose reason stays in the server's log.
func TestSessionSandboxNotStartedSaysWhy(t *testing.T) {
	m, _, fake := remoteManager(t)
	fake.CreateErr = func(sandbox.Spec) error {
		return errors.New(`Error response from daemon: exec: "docker-init": executable file not found in $PATH`)
	}
	const id = "sess-01m8jbh60d7qh1g11cxcbgpml0"
	_, _, err := m.startSandbox(context.Background(), m.opts.Placements.Usable(rtkind.Local), sandboxOf{id: id, network: task.NetworkNone, dir: ownDir(id)})
	if got := errdefs.HTTPStatus(err); got != http.StatusServiceUnavailable || !strings.Contains(errdefs.Message(err), "docker-init") {
		t.Errorf("a sandbox not started: %d %q; want 503 saying why", got, errdefs.Message(err))
	}
}
