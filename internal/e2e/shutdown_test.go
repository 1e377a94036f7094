//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/cluster"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/scheduler"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/session"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestShutdown: a server stopped with SIGTERM while a task runs and a
// session runs a command. With shutdown: stop it ends the task cancelled
// and the session, both with reason shutdown, within its bound, and once
// it has exited no sandbox process is left on the host (warm ones
// neither), so the next start finds nothing to reattach. With leave (the
// default) both run on through the stop, and the next start reattaches
// them.
func TestShutdown(t *testing.T) {
	testenv.RequireBwrap(t)
	t.Parallel()
	for i, mode := range []string{"stop", "leave"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			data := testenv.TempDir(t)
			cfg := filepath.Join(t.TempDir(), "corral.yaml")
			if err := os.WriteFile(cfg, []byte("shutdown: "+mode+"\nlimits: {stop_grace: 2s}\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			srv := startProcess(t, data, "--config", cfg)
			// Commands with arguments of their own, to be found among the
			// host's processes.
			taskSleep := []string{"sleep", fmt.Sprintf("3%d7.31", i)}
			sessionSleep := []string{"sleep", fmt.Sprintf("3%d7.32", i)}
			tk := mustSpawn(t, srv.client, service.SpawnRequest{TaskDescription: "runs through the stop", Agent: task.AgentCommand, Command: taskSleep})
			srv.waitRunning(t, tk.ID, 20*time.Second)
			sess := mustCreateSession(t, srv.client)
			if _, err := srv.client.Sessions().StartExec(ctx, sess.SessionID, service.SessionCommand{Command: sessionSleep}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the task's and the session's commands", func() bool { return processRunning(taskSleep...) && processRunning(sessionSleep...) })

			start := time.Now()
			srv.stop(t)
			took := time.Since(start)

			if mode == "leave" {
				if !processRunning(taskSleep...) || !processRunning(sessionSleep...) {
					t.Fatalf("after the stop: the task's command runs %v, the session's %v; want both left running", processRunning(taskSleep...), processRunning(sessionSleep...))
				}
				srv = startProcess(t, data, "--config", cfg)
				waitFor(t, "the task reattached", func() bool {
					return slices.Contains(eventTypes(t, srv.client, tk.ID), task.EventReattached)
				})
				if got, _ := srv.client.Get(ctx, tk.ID); got.Status != task.Running {
					t.Errorf("the task after the restart: %s, want running", got.Status)
				}
				var out strings.Builder
				if _, err := srv.client.ExecSession(ctx, sess.SessionID, httpapi.ExecBody{Command: shell("echo back")}, func(ch httpapi.ExecChunk) error {
					out.Write(ch.Bytes())
					return nil
				}); err != nil || out.String() != "back\n" {
					t.Errorf("a command in the session after the restart: %q, %v; want it to run", out.String(), err)
				}
				return
			}

			// stop_grace (2 s) and stopAll's 10 s of slack bound the stop,
			// and the HTTP server's 5 s before it.
			if took > 17*time.Second {
				t.Errorf("the server took %v to stop", took)
			}
			if left := sandboxProcs(data); len(left) > 0 {
				t.Errorf("sandbox processes left after the server exited: %v", left)
			}
			srv = startProcess(t, data, "--config", cfg)
			got, err := srv.client.Get(ctx, tk.ID)
			if err != nil {
				t.Fatal(err)
			}
			end := taskEnd(t, srv.client, tk.ID)
			if got.Status != task.Cancelled || end.Reason != "shutdown" || !strings.Contains(end.ErrorMessage, "the server shut down") {
				t.Errorf("the task: %s, its end %+v; want cancelled, reason shutdown, saying the server shut down", got.Status, end)
			}
			s, err := srv.client.GetSession(ctx, sess.SessionID)
			if err != nil {
				t.Fatal(err)
			}
			if s.Status != session.StatusEnded || s.EndReason != "shutdown" || !strings.Contains(s.EndError, "the server shut down") {
				t.Errorf("the session: %s, reason %q (%q); want ended by the shutdown", s.Status, s.EndReason, s.EndError)
			}
			// The next start's reconciliation found nothing of the last
			// server's running.
			var recs []scheduler.Reconciled
			waitFor(t, "the second start's reconciliation", func() bool {
				recs = nil
				srv.client.Events(ctx, service.EventsRequest{}, func(e eventstore.Event) error {
					var r scheduler.Reconciled
					if e.Type == task.EventReconciled && json.Unmarshal(e.Data, &r) == nil {
						recs = append(recs, r)
					}
					return nil
				})
				return len(recs) == 2
			})
			if recs[1] != (scheduler.Reconciled{}) {
				t.Errorf("the start after the stop reconciled %+v; want nothing to reattach, end or stop", recs[1])
			}
		})
	}
}

// TestShutdownStopOnAReplica: of two replicas on one PostgreSQL
// database, the one configured shutdown: stop, stopped with SIGTERM, ends
// its own tasks and session (reason shutdown) and hands nothing over: its
// tasks are never adopted, and the other's task and session run on. The
// end of each of its tasks is notified as any end is, by the replica that
// leads after it.
func TestShutdownStopOnAReplica(t *testing.T) {
	n, env := notifiedOnPostgres(t)
	env = append(env, "CORRAL_MAX_CONCURRENT=6")
	base, err := os.ReadFile(n.cfgFile)
	if err != nil {
		t.Fatal(err)
	}
	stopCfg := filepath.Join(t.TempDir(), "stop.yaml")
	if err := os.WriteFile(stopCfg, append(base, "shutdown: stop\nlimits: {stop_grace: 2s}\n"...), 0o600); err != nil {
		t.Fatal(err)
	}
	a := startReplica(t, n.data, env, "--config", stopCfg)
	b := startReplica(t, n.data, env, "--config", n.cfgFile)
	// The leader (a, up first) sees b live from its next renewal on.
	time.Sleep(2 * cluster.Renew)
	ctx := context.Background()

	// Tasks until one runs on each replica (the leader gives each to the
	// least busy), each with a command of its own to find on the host.
	argv := map[string][]string{}
	on := map[string][]string{} // replica -> its tasks
	for i := 0; len(on[a.id]) == 0 || len(on[b.id]) == 0; i++ {
		if i == 6 {
			t.Fatalf("six tasks did not run on both replicas: %v", on)
		}
		cmd := []string{"sleep", fmt.Sprintf("32%d.5", i)}
		tk := mustSpawn(t, a.client, service.SpawnRequest{TaskDescription: "on a replica", Agent: task.AgentCommand, Command: cmd})
		a.waitRunning(t, tk.ID, 30*time.Second)
		got, err := a.client.Get(ctx, tk.ID)
		if err != nil {
			t.Fatal(err)
		}
		argv[tk.ID] = cmd
		on[got.Replica] = append(on[got.Replica], tk.ID)
	}
	waitFor(t, "every task's command", func() bool {
		for _, cmd := range argv {
			if !processRunning(cmd...) {
				return false
			}
		}
		return true
	})
	sa, sb := mustCreateSession(t, a.client), mustCreateSession(t, b.client)

	a.stop(t)
	for _, id := range on[a.id] {
		got, err := b.client.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		end := taskEnd(t, b.client, id)
		if got.Status != task.Cancelled || end.Reason != "shutdown" {
			t.Errorf("task %s of the replica stopped: %s, reason %q; want cancelled by its shutdown", id, got.Status, end.Reason)
		}
		if types := eventTypes(t, b.client, id); slices.Contains(types, task.EventAdopted) {
			t.Errorf("task %s of the replica stopped was adopted: %v", id, types)
		}
		if processRunning(argv[id]...) {
			t.Errorf("task %s's command still runs after its replica stopped", id)
		}
	}
	for _, id := range on[b.id] {
		if got, _ := b.client.Get(ctx, id); got.Status != task.Running || !processRunning(argv[id]...) {
			t.Errorf("task %s of the other replica: %s, command running %v; want it left running", id, got.Status, processRunning(argv[id]...))
		}
	}
	if s, _ := b.client.GetSession(ctx, sa.SessionID); s.Status != session.StatusEnded || s.EndReason != "shutdown" {
		t.Errorf("the stopped replica's session: %s, reason %q; want ended by its shutdown", s.Status, s.EndReason)
	}
	if left := sandboxProcs(n.data)[sa.SessionID]; len(left) > 0 {
		t.Errorf("the stopped replica's session still has processes %v", left)
	}
	if s, _ := b.client.GetSession(ctx, sb.SessionID); s.Status != session.StatusRunning {
		t.Errorf("the other replica's session: %s, want running", s.Status)
	}
	for _, r := range waitReceived(t, n.out, on[a.id], time.Minute) {
		if slices.Contains(on[a.id], r.Payload.TaskID) && (r.Payload.Status != task.Cancelled || r.Payload.Reason != "shutdown") {
			t.Errorf("notified for task %s: %s, reason %q; want cancelled, shutdown", r.Payload.TaskID, r.Payload.Status, r.Payload.Reason)
		}
	}
}

// eventTypes returns the types of task id's events.
func eventTypes(t *testing.T, c *httpapi.Client, id string) []string {
	t.Helper()
	var out []string
	if err := c.Events(context.Background(), service.EventsRequest{TaskID: id}, func(e eventstore.Event) error {
		out = append(out, e.Type)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// taskEnd returns the payload of task id's worker_completed.
func taskEnd(t *testing.T, c *httpapi.Client, id string) task.Completed {
	t.Helper()
	var end task.Completed
	if err := c.Events(context.Background(), service.EventsRequest{TaskID: id}, func(e eventstore.Event) error {
		if e.Type == task.EventCompleted {
			return json.Unmarshal(e.Data, &end)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return end
}
