//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/postgres"
	"github.com/corral-dev/corral/internal/eventstore/postgres/postgrestest"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/session"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// replica is one `corral serve` process of a cluster, and its id.
type replica struct {
	*proc
	id  string
	log *testenv.SyncBuffer // its output, which the test's log has too
}

// onPostgres is what the replicas of a test share: a data root (whose
// sandboxes are killed when the test ends) and the environment that puts
// them on the PostgreSQL database dsn.
func onPostgres(t *testing.T, dsn string) (data string, env []string) {
	t.Helper()
	testenv.RequireBwrap(t)
	data = testenv.TempDir(t)
	t.Cleanup(func() { killSandboxes(t, data) })
	return data, storeEnv(dsn)
}

// storeEnv puts a server on the PostgreSQL database dsn.
func storeEnv(dsn string) []string {
	return []string{"CORRAL_STORE_DRIVER=postgres", "CORRAL_STORE_DSN=" + dsn}
}

// notifiedOnPostgres is onPostgres for replicas that notify a receiver the
// test starts, on the data root of n.
func notifiedOnPostgres(t *testing.T) (n notifySetup, env []string) {
	t.Helper()
	testenv.RequireBwrap(t)
	requireReceiver(t)
	n = mustNotifySetup(t, "")
	startReceiver(t, n.port, n.secret, n.out)
	t.Cleanup(func() { killSandboxes(t, n.data) })
	return n, storeEnv(postgrestest.New(t).DSN)
}

// startReplica starts a server process on data with the environment env
// added and extra flags, and reads its replica id from /healthz.
func startReplica(t *testing.T, data string, env []string, extra ...string) *replica {
	t.Helper()
	addr := freeLoopbackAddr(t)
	cmd := serveCommand(t, data, addr, extra...)
	cmd.Env = append(cmd.Env, env...)
	log := &testenv.SyncBuffer{}
	cmd.Stdout = io.MultiWriter(cmd.Stdout, log)
	cmd.Stderr = io.MultiWriter(cmd.Stderr, log)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, client: httpapi.NewClient("http://"+addr, ""), url: "http://" + addr}
	t.Cleanup(p.kill)
	waitHealthy(t, p.url)
	resp, err := http.Get(p.url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h struct{ Replica string }
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil || h.Replica == "" {
		t.Fatalf("/healthz names no replica: %v", err)
	}
	return &replica{proc: p, id: h.Replica, log: log}
}

// TestReplicasSurviveAKill: three servers on one PostgreSQL database and
// one data root share a burst of tasks; the one running the most is
// killed with SIGKILL mid-burst. Every acknowledged task ends once, with
// its own result, having run once; each completion is notified (a
// receiver counts: duplicates only with the same webhook-id); and waiters
// on the survivors see every end, the dead replica's tasks' too.
func TestReplicasSurviveAKill(t *testing.T) {
	t.Parallel()
	n, env := notifiedOnPostgres(t)
	env = append(env, "CORRAL_MAX_CONCURRENT=9")
	var rs []*replica
	for range 3 {
		rs = append(rs, startReplica(t, n.data, env, "--config", n.cfgFile))
	}

	// The burst: spawned through all three, each task counting its runs
	// in its output and ending a few seconds later.
	const tasks = 18
	ids := make([]string, tasks)
	for i := range ids {
		tk := mustSpawn(t, rs[i%3].client, service.SpawnRequest{TaskDescription: fmt.Sprintf("burst %d", i), Agent: "command",
			Command: []string{"sh", "-c", fmt.Sprintf("echo run >> output/runs; sleep 4; echo %d > output/result.txt", i)}})
		ids[i] = tk.ID
	}

	// Kill the replica running the most, once tasks run on every one.
	// (One list a look: the API's rate limit counts every request.)
	var victim *replica
	for deadline := time.Now().Add(60 * time.Second); victim == nil; time.Sleep(100 * time.Millisecond) {
		running := map[string]int{}
		page, err := rs[0].client.List(context.Background(), service.ListRequest{Status: string(task.Running), Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range page.Tasks {
			running[tk.Replica]++
		}
		if len(running) == 3 {
			for _, r := range rs {
				if victim == nil || running[r.id] > running[victim.id] {
					victim = r
				}
			}
			t.Logf("running per replica: %v; killing %s", running, victim.id)
		}
		if time.Now().After(deadline) {
			t.Fatalf("tasks never ran on all three replicas: %v", running)
		}
	}
	victim.kill()
	var survivors []*replica
	for _, r := range rs {
		if r != victim {
			survivors = append(survivors, r)
		}
	}

	// Waiters on both survivors see every end.
	var wg sync.WaitGroup
	results := make([][]service.Result, len(survivors))
	for i, r := range survivors {
		results[i] = make([]service.Result, tasks)
		for j, id := range ids {
			wg.Go(func() {
				for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); {
					ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
					res, err := r.client.Result(ctx, service.ResultRequest{TaskID: id, Wait: 50 * time.Second, IncludeFileContents: []string{"runs", "result.txt"}})
					cancel()
					if err != nil {
						t.Errorf("waiting on %s for %s: %v", r.id, id, err)
						return
					}
					if res.Done {
						results[i][j] = res
						return
					}
				}
				t.Errorf("task %s did not end, seen on %s", id, r.id)
			})
		}
	}
	wg.Wait()
	adopted := 0
	for j, id := range ids {
		for i, r := range survivors {
			res := results[i][j]
			if res.Status != task.Success {
				t.Errorf("task %s, seen on %s: %s %q", id, r.id, res.Status, res.ErrorMessage)
				continue
			}
			if got := res.FileContents["result.txt"].Content; got != fmt.Sprintf("%d\n", j) {
				t.Errorf("task %s: result %q, want its own", id, got)
			}
			if got := res.FileContents["runs"].Content; got != "run\n" {
				t.Errorf("task %s ran %d times", id, strings.Count(got, "run"))
			}
		}
		evs := mustEvents(t, survivors[0].client, id)
		ends := 0
		for _, e := range evs {
			switch e.Type {
			case task.EventCompleted:
				ends++
			case task.EventAdopted:
				adopted++
			}
		}
		if ends != 1 {
			t.Errorf("task %s has %d ends", id, ends)
		}
	}
	if adopted == 0 {
		t.Error("no task was adopted from the replica killed")
	}
	t.Logf("%d tasks adopted from %s", adopted, victim.id)

	// Every completion notified; a duplicate keeps its webhook-id.
	got := waitReceived(t, n.out, ids, time.Minute)
	byTask := map[string]map[string]bool{}
	for _, r := range got {
		if !r.Verified {
			continue
		}
		if byTask[r.Payload.TaskID] == nil {
			byTask[r.Payload.TaskID] = map[string]bool{}
		}
		byTask[r.Payload.TaskID][r.WebhookID] = true
	}
	for _, id := range ids {
		if len(byTask[id]) != 1 {
			t.Errorf("task %s notified under %d webhook ids", id, len(byTask[id]))
		}
	}
	// Every replica lists the deliveries, whichever sent them.
	for _, r := range survivors {
		ns := &notifyServer{r.proc}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if n := len(ns.deliveries(t, "delivered")); n >= tasks {
				break
			} else if time.Now().After(deadline) {
				t.Errorf("%s lists %d deliveries delivered, want %d", r.id, n, tasks)
				break
			}
		}
	}
}

// mustEvents returns task id's events through c.
func mustEvents(t *testing.T, c *httpapi.Client, id string) []eventstore.Event {
	t.Helper()
	var evs []eventstore.Event
	if err := c.Events(context.Background(), service.EventsRequest{TaskID: id}, func(e eventstore.Event) error {
		evs = append(evs, e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return evs
}

// TestReplicasRideOutAPostgresRestart: two replicas run a burst of tasks
// while their PostgreSQL server stops for a few seconds and starts again.
// They reconnect by themselves; every task ends once with its own result;
// and none is adopted, though every lease lapsed meanwhile: a replica back
// from the cut judges no one until its own lease has held for a TTL.
func TestReplicasRideOutAPostgresRestart(t *testing.T) {
	t.Parallel()
	pg := postgrestest.NewServer(t)
	data, env := onPostgres(t, pg.DSN)
	a, b := startReplica(t, data, env), startReplica(t, data, env)
	var ids []string
	for i := range 6 {
		tk := mustSpawn(t, []*replica{a, b}[i%2].client, service.SpawnRequest{TaskDescription: fmt.Sprintf("through the restart %d", i), Agent: "command",
			Command: []string{"sh", "-c", fmt.Sprintf("echo run >> output/runs; sleep 3; echo %d > output/result.txt", i)}})
		ids = append(ids, tk.ID)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		page, err := a.client.List(context.Background(), service.ListRequest{Status: string(task.Running), Limit: 100})
		if err == nil && len(page.Tasks) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no task ran: %v", err)
		}
	}
	pg.Stop(t)
	time.Sleep(4 * time.Second) // past a lease's TTL
	// Not ready meanwhile: a load balancer sends clients elsewhere.
	if resp, err := http.Get(a.url + "/healthz"); err != nil {
		t.Error(err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "store unreachable") {
			t.Errorf("/healthz with the store down: %s %s, want 503 saying the store is unreachable", resp.Status, body)
		}
	}
	pg.Start(t)
	waitHealthy(t, a.url)
	after := mustSpawn(t, b.client, service.SpawnRequest{TaskDescription: "after the restart", Agent: "command",
		Command: []string{"sh", "-c", "echo run >> output/runs; echo 6 > output/result.txt"}})
	ids = append(ids, after.ID)
	for j, id := range ids {
		s := &server{client: []*replica{a, b}[j%2].client}
		res := s.wait(t, id, 2*time.Minute, "runs", "result.txt")
		if res.Status != task.Success || res.FileContents["result.txt"].Content != fmt.Sprintf("%d\n", j) || res.FileContents["runs"].Content != "run\n" {
			t.Errorf("task %s: %s %q, result %q, runs %q; want success, its own result, one run", id, res.Status, res.ErrorMessage,
				res.FileContents["result.txt"].Content, res.FileContents["runs"].Content)
		}
		for _, e := range mustEvents(t, a.client, id) {
			if e.Type == task.EventAdopted {
				t.Errorf("task %s adopted, though no replica died: %s", id, e.Data)
			}
		}
	}
}

// TestSessionsOfAReplicaKilled: two servers on one PostgreSQL database and
// one data root; the one running two sessions is killed with SIGKILL while
// a command runs in one of them. That session's exec agent dials the
// host's shared socket: the survivor adopts the session, takes the command
// over (its whole output and its end are read from the survivor), and
// runs the next commands. The
// other session's sandbox died with the server (as one on a machine no
// replica is left on would be out of reach: no agent dials in again): the
// survivor ends it lost, saying why, once its agent had time to.
func TestSessionsOfAReplicaKilled(t *testing.T) {
	t.Parallel()
	db := postgrestest.New(t)
	data, env := onPostgres(t, db.DSN)
	a, b := startReplica(t, data, env), startReplica(t, data, env)
	kept, orphan := mustCreateSession(t, a.client), mustCreateSession(t, a.client)
	ctx := context.Background()
	execID, err := a.client.Sessions().StartExec(ctx, kept.SessionID, service.SessionCommand{Shell: "echo started; sleep 5; echo done"})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the command in the session started", func() bool {
		var out strings.Builder
		a.client.Sessions().ReadExec(ctx, kept.SessionID, execID, 0, false, func(o service.ExecOutput) error { out.Write(o.Data); return nil })
		return out.String() == "started\n"
	})
	a.kill()
	killed := time.Now()
	if err := exec.Command("pkill", "-KILL", "-f", orphan.SessionID).Run(); err != nil {
		t.Fatalf("kill the sandbox of session %s: %v", orphan.SessionID, err)
	}

	// The survivor runs the kept session's commands once it is adopted.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var out strings.Builder
		end, err := b.client.ExecSession(ctx, kept.SessionID, httpapi.ExecBody{Command: shell("echo again")},
			func(ch httpapi.ExecChunk) error { out.Write(ch.Bytes()); return nil })
		if err == nil && end.ExitCode == 0 && out.String() == "again\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the survivor never ran a command in the session adopted: %+v %q %v", end, out.String(), err)
		}
	}
	// The command the kill cut was taken over: its whole output, once,
	// and its end.
	var out strings.Builder
	end, err := b.client.Sessions().ReadExec(ctx, kept.SessionID, execID, 0, true, func(o service.ExecOutput) error { out.Write(o.Data); return nil })
	if err != nil || end == nil || end.ExitCode != 0 || end.Reason != "" || out.String() != "started\ndone\n" {
		t.Errorf("the command through the kill, read from the survivor: %+v, %q, %v; want exit 0, started and done", end, out.String(), err)
	}
	store, err := postgres.Open(ctx, db.DSN, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	evs, err := store.ReadStream(ctx, "session/"+kept.SessionID, 0)
	if err != nil {
		t.Fatal(err)
	}
	adoptions, lost := 0, 0
	for _, e := range evs {
		switch e.Type {
		case session.EventAdopted:
			adoptions++
			if !strings.Contains(string(e.Data), b.id) || !strings.Contains(string(e.Data), a.id) {
				t.Errorf("session adopted: %s, want by %s from %s", e.Data, b.id, a.id)
			}
		case session.EventExecEnd:
			var end service.SessionExecEnd
			if json.Unmarshal(e.Data, &end) == nil && end.Reason == "lost" {
				lost++
			}
		}
	}
	if adoptions != 1 || lost != 0 {
		t.Errorf("the kept session's log: %d adoptions, %d execs ended lost; want 1 and 0", adoptions, lost)
	}
	// Its exec agent, which dialled the survivor on the host's shared
	// socket, waited there for the killed replica's lease to lapse: not
	// refused at each of its dials (every 10 ms, once).
	refusals := 0
	for line := range strings.Lines(b.log.String()) {
		if strings.Contains(line, `msg="session exec agent refused"`) && strings.Contains(line, kept.SessionID) {
			refusals++
		}
	}
	if refusals > 2 {
		t.Errorf("the survivor refused the kept session's agent %d times; want it held until the lease lapsed", refusals)
	}

	// The orphan ends lost, saying why, within the agent's wait.
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		s, err := b.client.GetSession(ctx, orphan.SessionID)
		if err != nil {
			t.Fatal(err)
		}
		if s.Status == service.SessionEnded {
			if s.EndReason != "lost" || !strings.Contains(s.EndError, a.id) || !strings.Contains(s.EndError, "reached no other replica") {
				t.Errorf("the orphan ended %q: %q; want lost, naming the replica gone", s.EndReason, s.EndError)
			}
			t.Logf("the orphan ended %s after the kill", time.Since(killed).Round(time.Second))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session whose sandbox died with its replica is still %s 90 s after the kill", s.Status)
		}
	}
}

// waitKilled waits for r, which a crash point kills, to die of SIGKILL.
func waitKilled(t *testing.T, r *replica, point string) {
	t.Helper()
	exited := make(chan error, 1)
	go func() { exited <- r.cmd.Wait() }()
	select {
	case <-exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("replica %s did not reach crash point %q", r.id, point)
	}
	if ws, ok := r.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("replica %s ended %v, not killed at crash point %q", r.id, r.cmd.ProcessState, point)
	}
}

// TestAnAdopterKilled: the replica that adopts the task of a replica
// killed is itself killed between its record of the adoption and its
// reattachment (sandbox.CrashAdopted). The next replica adopts the task
// from it in turn; the task ends once, with its own result, having run
// once.
func TestAnAdopterKilled(t *testing.T) {
	t.Parallel()
	db := postgrestest.New(t)
	data, env := onPostgres(t, db.DSN)
	a := startReplica(t, data, env)
	tk := mustSpawn(t, a.client, service.SpawnRequest{TaskDescription: "adopted twice", Agent: "command",
		Command: []string{"sh", "-c", "echo run >> output/runs; : > output/go; while [ -e output/go ]; do sleep 0.1; done; echo done > output/result.txt"}})
	a.waitRunning(t, tk.ID, 30*time.Second)
	b := startReplica(t, data, append(env, "CORRAL_TEST_CRASH_AT="+sandbox.CrashAdopted))
	a.kill()
	waitKilled(t, b, sandbox.CrashAdopted)
	c := startReplica(t, data, env)
	// The task runs on until c has adopted it: a task that ends by
	// itself first is ended without an adoption, rightly (it did so
	// once at a load of 8 with a fixed sleep).
	waitFor(t, "the second adoption", func() bool {
		n := 0
		for _, e := range mustEvents(t, c.client, tk.ID) {
			if e.Type == task.EventAdopted {
				n++
			}
		}
		return n == 2
	})
	if err := os.Remove(filepath.Join(data, "tasks", tk.ID, "output", "go")); err != nil {
		t.Fatal(err)
	}
	res := (&server{client: c.client}).wait(t, tk.ID, 2*time.Minute, "runs", "result.txt")
	if res.Status != task.Success || res.FileContents["result.txt"].Content != "done\n" || res.FileContents["runs"].Content != "run\n" {
		t.Errorf("the task: %s %q, result %q, runs %q; want success, its result, one run", res.Status, res.ErrorMessage,
			res.FileContents["result.txt"].Content, res.FileContents["runs"].Content)
	}
	var froms []string
	ends := 0
	for _, e := range mustEvents(t, c.client, tk.ID) {
		switch e.Type {
		case task.EventAdopted:
			var ad task.Adopted
			json.Unmarshal(e.Data, &ad)
			froms = append(froms, ad.From+">"+ad.Replica)
		case task.EventCompleted:
			ends++
		}
	}
	if want := []string{a.id + ">" + b.id, b.id + ">" + c.id}; !slices.Equal(froms, want) || ends != 1 {
		t.Errorf("adoptions %v and %d ends; want %v and 1", froms, ends, want)
	}
}

// TestALeaderKilledDelivering: the leader, which sends the cluster's
// notifications, is killed between a notification's 2xx and its record
// (sandbox.CrashDelivered). The next leader sends it again, under the same
// webhook-id (a duplicate as Standard Webhooks allows), and records it
// delivered, once.
func TestALeaderKilledDelivering(t *testing.T) {
	t.Parallel()
	n, env := notifiedOnPostgres(t)
	// The first to join leads.
	leader := startReplica(t, n.data, append(env, "CORRAL_TEST_CRASH_AT="+sandbox.CrashDelivered), "--config", n.cfgFile)
	next := startReplica(t, n.data, env, "--config", n.cfgFile)
	tk := mustSpawn(t, next.client, service.SpawnRequest{TaskDescription: "notified twice", Agent: "command",
		Command: []string{"sh", "-c", "echo hi > output/hi.txt"}})
	waitKilled(t, leader, sandbox.CrashDelivered)
	ns := &notifyServer{next.proc}
	var delivered []task.Delivery
	for deadline := time.Now().Add(30 * time.Second); len(delivered) == 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the next leader did not deliver the notification the leader's kill left unrecorded")
		}
		delivered = ns.deliveries(t, "delivered")
	}
	ids := map[string]int{}
	for _, r := range waitReceived(t, n.out, []string{tk.ID}, time.Minute) {
		if r.Verified && r.Payload.TaskID == tk.ID {
			ids[r.WebhookID]++
		}
	}
	if len(delivered) != 1 || delivered[0].TaskID != tk.ID || len(ids) != 1 || ids[delivered[0].ID] != 2 {
		t.Errorf("deliveries recorded %+v; received by webhook-id %v; want one delivery, received twice under its id", delivered, ids)
	}
}
