//go:build integration

package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/execagent"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes/k8stest"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/session"
)

// TestKubernetesSession: a session on the kubernetes runtime is a worker
// pod on the session's directory whose exec agent dials the server over
// the network: its commands' output comes byte for byte with their exit
// codes, a file one writes the next reads; a server killed with SIGKILL
// and started again reattaches to the same pod; a suspend keeps the files
// alone, ends the pod and says so, and a resume starts a new pod on the
// same directory; a session whose pod is deleted from outside ends lost;
// a delete removes the pod. A session with a network is
// refused by a server without an egress listener for pods
// (TestKubernetesSessionEgress has one). Under runc and gVisor.
func TestKubernetesSession(t *testing.T) {
	t.Parallel()
	for _, class := range []string{"", k8stest.GVisor} {
		t.Run(className(class), func(t *testing.T) {
			t.Parallel()
			testKubernetesSession(t, class)
		})
	}
}

func testKubernetesSession(t *testing.T, class string) {
	k := killableOnKubernetes(t, class)
	ctx := context.Background()
	srv := k.start(t)
	if _, err := srv.client.CreateSession(ctx, service.CreateSessionRequest{Network: "open"}); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "network none only") || !strings.Contains(err.Error(), "kubernetes.egress_listen") {
		t.Errorf("a session with a network on kubernetes without an egress listener: %v; want 422 saying it has network none only, and why", err)
	}
	created := mustCreateSession(t, srv.client)
	id := created.SessionID
	if created.Session.Runtime != kubernetes.Name {
		t.Fatalf("the session runs on %q, want kubernetes", created.Session.Runtime)
	}
	pods := func() []corev1.Pod {
		t.Helper()
		l, err := k.cs.CoreV1().Pods(k.ns).List(ctx, metav1.ListOptions{LabelSelector: "corral.sandbox-id=" + id})
		if err != nil {
			t.Fatal(err)
		}
		return slices.DeleteFunc(l.Items, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil })
	}
	first := pods()
	if len(first) != 1 {
		t.Fatalf("%d pods for the session, want 1", len(first))
	}
	// A worker pod as a task's: the NetworkPolicy's label, no token,
	// locked down.
	p := first[0]
	c := p.Spec.Containers[0]
	if p.Labels["app"] != kubernetes.AppWorker || p.Labels["corral.session-id"] != "true" || *p.Spec.AutomountServiceAccountToken ||
		!*c.SecurityContext.ReadOnlyRootFilesystem || *c.SecurityContext.AllowPrivilegeEscalation || c.SecurityContext.Capabilities.Drop[0] != "ALL" {
		t.Errorf("the session's pod: labels %v, container security %+v; want a worker pod's", p.Labels, c.SecurityContext)
	}

	// On the HTTP listener too, only the session's exec agent attaches
	// as it: neither the session's token nor the API token.
	for name, token := range map[string]string{"the session's token": created.Token, "the API token": k.token} {
		conn, err := net.Dial("tcp", k.addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST /api/sessions/%s/agent HTTP/1.1\r\nHost: corral\r\nAuthorization: Bearer %s\r\nConnection: Upgrade\r\nUpgrade: %s\r\nContent-Length: 0\r\n\r\n", id, token, execagent.Upgrade)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil || resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s attaching as the agent over HTTP: %v, %v; want 403", name, resp, err)
		}
		conn.Close()
	}

	exec := func(script string) (stdout, stderr string, code int) {
		t.Helper()
		var o, e bytes.Buffer
		end, err := srv.client.ExecSession(ctx, id, httpapi.ExecBody{Command: shell(script)}, func(ch httpapi.ExecChunk) error {
			if ch.Type == "stdout" {
				o.Write(ch.Bytes())
			} else {
				e.Write(ch.Bytes())
			}
			return nil
		})
		if err != nil {
			t.Fatalf("exec %q: %v", script, err)
		}
		return o.String(), e.String(), end.ExitCode
	}
	// Bytes that are no text, both streams, an exit code.
	if o, e, code := exec(`printf 'a\000\377b\r\n'; printf 'to stderr' >&2; exit 7`); o != "a\x00\xffb\r\n" || e != "to stderr" || code != 7 {
		t.Errorf("exec: stdout %q, stderr %q, code %d; want the bytes as written and 7", o, e, code)
	}
	// The agent came over the network: a pod mounts no socket of the
	// server's host (which a pod on another node could not reach).
	if o, _, code := exec(`id -u; pwd; ls /run/corral; echo kept > f.txt`); o != "1000\n"+session.Dir+"\ncorral\ncorral-worker\n" || code != 0 {
		t.Errorf("exec: %q, code %d; want uid 1000 in %s, and no socket directory in /run/corral", o, code, session.Dir)
	}
	if o, _, _ := exec(`cat f.txt`); o != "kept\n" {
		t.Errorf("the next exec read %q, want kept", o)
	}
	if b, err := os.ReadFile(filepath.Join(k.data, "sessions", id, "f.txt")); err != nil || string(b) != "kept\n" {
		t.Errorf("the session's directory on the claim: %q, %v", b, err)
	}
	// A fork is a pod of its own on a copy of the files, its memory not
	// kept (no node runtime here checkpoints), and says so.
	if r, err := srv.client.Sessions().Fork(ctx, id, 1); err != nil || len(r.Forks) != 1 || r.MemoryKept || r.Files != 1 {
		t.Errorf("fork on kubernetes: %+v, %v; want one fork of the files", r, err)
	} else if got := mustRun(t, srv.client, r.Forks[0].SessionID, "cat f.txt; echo mine > f.txt"); got != "kept\n" {
		t.Errorf("the fork read %q, want the source's file", got)
	} else if o, _, _ := exec(`cat f.txt`); o != "kept\n" {
		t.Errorf("the source read %q after its fork wrote its own copy", o)
	} else if _, err := srv.client.DeleteSession(ctx, r.Forks[0].SessionID); err != nil {
		t.Error(err)
	}

	// Killed and started again: the same pod, its agent dialled in anew;
	// a command that ran through the kill runs on, and its whole output
	// is read from the next server.
	through, err := srv.client.Sessions().StartExec(ctx, id, service.SessionCommand{Shell: "echo before; touch started; while [ ! -e go ]; do sleep 0.05; done; echo after; exit 4"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the command's start", func() bool {
		_, err := os.Stat(filepath.Join(k.data, "sessions", id, "started"))
		return err == nil
	})
	srv.kill()
	srv = k.start(t)
	if err := os.WriteFile(filepath.Join(k.data, "sessions", id, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	end, err := srv.client.Sessions().ReadExec(ctx, id, through, 0, true, func(o service.ExecOutput) error { out.Write(o.Data); return nil })
	if err != nil || end == nil || end.ExitCode != 4 || out.String() != "before\nafter\n" {
		t.Errorf("the command through the kill: %+v, %q, %v; want exit 4 and its two lines once", end, out.String(), err)
	}
	if o, _, code := exec(`cat f.txt; echo again >> f.txt`); o != "kept\n" || code != 0 {
		t.Errorf("after a kill -9: %q, code %d; want the session's file", o, code)
	}
	if now := pods(); len(now) != 1 || now[0].UID != first[0].UID {
		t.Errorf("after a kill -9, %d pods, want the session's one, reattached", len(now))
	}

	// Suspended: the files alone, and said so; no pod meanwhile.
	sc := srv.client.Sessions()
	r, err := sc.Suspend(ctx, id)
	if err != nil || r.Session.Status != service.SessionSuspended || r.MemoryKept || !strings.Contains(r.Note, "processes ended") {
		t.Fatalf("suspend: %+v, %v; want suspended, memory not kept, and said so", r, err)
	}
	if n := len(pods()); n != 0 {
		t.Errorf("%d pods while the session is suspended, want none", n)
	}
	var kept []bool
	srv.client.Events(ctx, service.EventsRequest{}, func(e eventstore.Event) error {
		if e.StreamID == session.StreamID(id) && e.Type == session.EventSuspended {
			var ev struct {
				MemoryKept bool `json:"memory_kept"`
			}
			json.Unmarshal(e.Data, &ev)
			kept = append(kept, ev.MemoryKept)
		}
		return nil
	})
	if !slices.Equal(kept, []bool{false}) {
		t.Errorf("the session's %s events say memory kept %v, want [false]", session.EventSuspended, kept)
	}
	if s, err := sc.Resume(ctx, id); err != nil || s.Status != service.SessionRunning {
		t.Fatalf("resume: %+v, %v", s, err)
	}
	if now := pods(); len(now) != 1 || now[0].UID == first[0].UID {
		t.Errorf("after the resume, %d pods; want a new one", len(now))
	}
	if o, _, _ := exec(`cat f.txt`); o != "kept\nagain\n" {
		t.Errorf("after the resume: %q, want the file as it was", o)
	}

	// Its pod deleted from outside (an operator, a node drained): the
	// session ends lost, saying its sandbox ended, and its command with it.
	gone := mustCreateSession(t, srv.client).SessionID
	running, err := sc.StartExec(ctx, gone, service.SessionCommand{Shell: "sleep 300"})
	if err != nil {
		t.Fatal(err)
	}
	l, err := k.cs.CoreV1().Pods(k.ns).List(ctx, metav1.ListOptions{LabelSelector: "corral.sandbox-id=" + gone})
	if err != nil || len(l.Items) != 1 {
		t.Fatalf("the second session's pods: %d, %v", len(l.Items), err)
	}
	if err := k.cs.CoreV1().Pods(k.ns).Delete(ctx, l.Items[0].Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the session whose pod was deleted ended", func() bool {
		s, err := srv.client.GetSession(ctx, gone)
		return err == nil && s.Status == service.SessionEnded
	})
	if s, _ := srv.client.GetSession(ctx, gone); s.EndReason != "lost" || !strings.Contains(s.EndError, "sandbox") {
		t.Errorf("the session whose pod was deleted ended %q: %q; want lost, saying its sandbox ended", s.EndReason, s.EndError)
	}
	if end, err := sc.ReadExec(ctx, gone, running, 0, false, func(service.ExecOutput) error { return nil }); err != nil || end == nil || end.Reason != "lost" {
		t.Errorf("its command: %+v, %v; want ended lost", end, err)
	}

	if _, err := srv.client.DeleteSession(ctx, id); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(60 * time.Second); len(pods()) > 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the deleted session's pod is still there")
		}
	}
	jobs, err := k.cs.BatchV1().Jobs(k.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs.Items) != 0 {
		t.Errorf("%d Jobs left after the delete, want none", len(jobs.Items))
	}
}
