//go:build integration

package e2e_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/corral-dev/corral/internal/egress"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes/k8stest"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/session"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workerproto"
)

// egressOnKubernetes is killableOnKubernetes with the egress listener on
// the node's bridge address, at a port that stays the same across
// restarts (the pods have it in their environment), and egress.allow
// allow; it returns the listener's address.
func egressOnKubernetes(t *testing.T, class string, allow ...string) (kubeServer, string) {
	t.Helper()
	k := killableOnKubernetes(t, class)
	addr := freeAddr(t, k8stest.NodeIP)
	b, err := os.ReadFile(k.cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	list, _ := json.Marshal(allow)
	yaml := strings.Replace(string(b), "kubernetes:\n", fmt.Sprintf("kubernetes:\n  egress_listen: %s\n", addr), 1) +
		fmt.Sprintf("egress:\n  allow: %s\n", list)
	if err := os.WriteFile(k.cfgFile, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return k, addr
}

// TestKubernetesSessionEgress: a session on the kubernetes runtime with
// network allowlist reaches a listed host of the server's machine through
// its proxy, which its pod reaches over the server's egress listener (the
// host's loopback is not the pod's), and is refused an unlisted one, every
// attempt recorded on the session's stream; after a kill -9 and a restart
// of the server the same pod's egress works on. Each session proves itself
// with its own key: another's opens nothing of it, and the key of a
// session deleted opens nothing at all. Under runc and gVisor.
func TestKubernetesSessionEgress(t *testing.T) {
	t.Parallel()
	for _, class := range []string{"", k8stest.GVisor} {
		t.Run(className(class), func(t *testing.T) {
			t.Parallel()
			testKubernetesSessionEgress(t, class)
		})
	}
}

func testKubernetesSessionEgress(t *testing.T, class string) {
	up, unlisted := mustLoopbackServer(t), mustLoopbackServer(t)
	k, egressAddr := egressOnKubernetes(t, class, up.addr)
	ctx := context.Background()
	srv := k.start(t)
	fetch := mustInstallFetch(t, k.data)
	create := func() string {
		t.Helper()
		created, err := srv.client.CreateSession(ctx, service.CreateSessionRequest{Network: task.NetworkAllowlist})
		if err != nil {
			t.Fatalf("a session with network allowlist on kubernetes: %v", err)
		}
		if created.Session.Network != task.NetworkAllowlist {
			t.Fatalf("the session's network is %q, want allowlist", created.Session.Network)
		}
		return created.SessionID
	}
	a, b := create(), create()
	// run runs egressfetch in session id with steps, and returns what
	// each found.
	run := func(id string, steps ...string) map[string]fetchResult {
		t.Helper()
		end, err := srv.client.ExecSession(ctx, id, httpapi.ExecBody{Command: shell("mkdir -p output && " + fetch + " " + strings.Join(steps, " "))}, func(httpapi.ExecChunk) error { return nil })
		if err != nil || end.ExitCode != 0 {
			t.Fatalf("egressfetch in session %s: %+v, %v", id, end, err)
		}
		raw, err := os.ReadFile(filepath.Join(k.data, "sessions", id, "output", "result.json"))
		if err != nil {
			t.Fatal(err)
		}
		var rs []fetchResult
		if err := json.Unmarshal(raw, &rs); err != nil {
			t.Fatalf("egressfetch's result %q: %v", raw, err)
		}
		out := map[string]fetchResult{}
		for _, r := range rs {
			out[r.Step+" "+r.Arg] = r
		}
		return out
	}
	reached := func(r map[string]fetchResult, path string) {
		t.Helper()
		if g := r["get http://"+up.addr+path]; !g.OK || g.Body != "hello from the host: "+path {
			t.Errorf("GET %s of the listed host: %+v", path, g)
		}
	}

	r := run(a, "env", "get", "http://"+up.addr+"/a", "get", "http://"+unlisted.addr+"/a", "get", "http://unlisted.example/")
	if e := r["env "]; !strings.Contains(e.Body, "HTTP_PROXY=http://127.0.0.1:3128") {
		t.Errorf("the session's commands' proxy variables: %q", e.Body)
	}
	reached(r, "/a")
	for _, u := range []string{"http://" + unlisted.addr + "/a", "http://unlisted.example/"} {
		if g := r["get "+u]; g.Status != http.StatusForbidden || !strings.Contains(g.Body, "denied") {
			t.Errorf("GET %s, not listed: %+v, want 403 from the proxy", u, g)
		}
	}
	if got := unlisted.served(); len(got) != 0 {
		t.Errorf("the unlisted server served %v", got)
	}
	// Recorded on the session's stream, once the proxy saw each end.
	var evs []task.EgressConnection
	waitFor(t, "the session's egress events", func() bool {
		evs = nil
		srv.client.Events(ctx, service.EventsRequest{}, func(e eventstore.Event) error {
			if e.StreamID == session.StreamID(a) && e.Type == task.EventEgressConnection {
				var ec task.EgressConnection
				json.Unmarshal(e.Data, &ec)
				evs = append(evs, ec)
			}
			return nil
		})
		return len(evs) >= 3
	})
	if _, ok := findEvent(evs, "GET", "127.0.0.1", true); !ok {
		t.Errorf("no allowed GET among the session's egress events: %+v", evs)
	}
	if _, ok := findEvent(evs, "GET", "unlisted.example", false); !ok {
		t.Errorf("no denied GET among the session's egress events: %+v", evs)
	}

	// Each pod's key, from its environment Secret (where only the
	// session's exec agent reads it): with it, a connection to the
	// listener opens that session's proxy, and no other's.
	keyOf := func(id string) []byte {
		t.Helper()
		sec, err := k.cs.CoreV1().Secrets(k.ns).Get(ctx, id+"-env", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		key, err := hex.DecodeString(string(sec.Data[workerproto.EnvSessionEgressKey]))
		if err != nil || len(key) == 0 {
			t.Fatalf("session %s's pod has no egress key (%v): %v", id, err, sec.Data)
		}
		return key
	}
	keyA, keyB := keyOf(a), keyOf(b)
	dial := func(id string, key []byte) error {
		c, err := egress.DialTask(egressAddr, id, key, 5*time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}
	keys := func(when string) {
		t.Helper()
		if err := dial(a, keyA); err != nil {
			t.Errorf("%s: session %s with its own key: %v", when, a, err)
		}
		if err := dial(b, keyB); err != nil {
			t.Errorf("%s: session %s with its own key: %v", when, b, err)
		}
		if err := dial(a, keyB); err == nil {
			t.Errorf("%s: session %s's proxy opened with another session's key", when, a)
		}
		if err := dial(b, keyA); err == nil {
			t.Errorf("%s: session %s's proxy opened with another session's key", when, b)
		}
	}
	keys("running")

	// Killed and started again: the same pod's relay reaches the next
	// server's proxy with the same key.
	srv.kill()
	srv = k.start(t)
	reached(run(a, "get", "http://"+up.addr+"/after-kill"), "/after-kill")
	keys("after a kill -9")

	// Deleted: its key opens nothing; the other session's egress works on.
	if _, err := srv.client.DeleteSession(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := dial(a, keyA); err == nil {
		t.Errorf("the key of a deleted session still opens its proxy")
	}
	reached(run(b, "get", "http://"+up.addr+"/b"), "/b")
	if got := strings.Join(up.served(), ","); got != "/a,/after-kill,/b" {
		t.Errorf("the listed server served %s, want /a, /after-kill and /b", got)
	}
}
