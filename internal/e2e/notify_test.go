//go:build integration

package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/notify"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// notifyReceiverDir holds the Node receiver, which verifies notifications
// with the official standardwebhooks npm library.
var notifyReceiverDir = filepath.Join("..", "..", "test", "notify")

// requireReceiver needs node and the receiver's installed packages
// (`npm ci --prefix test/notify`, which .ci/run does).
func requireReceiver(t *testing.T) {
	t.Helper()
	testenv.RequireBinary(t, "node", "apt-get install -y nodejs npm")
	if _, err := os.Stat(filepath.Join(notifyReceiverDir, "node_modules", "standardwebhooks", "package.json")); err != nil {
		testenv.Missing(t, "test/notify/node_modules (run: npm ci --prefix test/notify)")
	}
}

// nodeReceiver is the Node receiver process.
type nodeReceiver struct {
	cmd *exec.Cmd
}

// startReceiver starts the receiver on port, recording to out.
func startReceiver(t *testing.T, port int, secret, out string) *nodeReceiver {
	t.Helper()
	cmd := exec.Command("node", "receiver.js")
	cmd.Dir = notifyReceiverDir
	cmd.Env = append(os.Environ(), fmt.Sprintf("PORT=%d", port), "SECRET="+secret, "OUT="+out)
	cmd.Stderr = testWriter{t}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &nodeReceiver{cmd: cmd}
	t.Cleanup(r.kill)
	ready := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		ready <- line
	}()
	select {
	case line := <-ready:
		if !strings.HasPrefix(line, "listening ") {
			t.Fatalf("receiver said %q", line)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the receiver did not start")
	}
	return r
}

func (r *nodeReceiver) kill() {
	if r.cmd.ProcessState == nil {
		r.cmd.Process.Signal(syscall.SIGKILL)
		r.cmd.Wait()
	}
}

// received is one line the receiver wrote.
type received struct {
	WebhookID    string            `json:"webhook_id"`
	ReceivedAtMS int64             `json:"received_at_ms"`
	Verified     bool              `json:"verified"`
	Error        string            `json:"error"`
	Payload      notify.Completion `json:"payload"`
}

func readReceived(t *testing.T, out string) []received {
	t.Helper()
	b, err := os.ReadFile(out)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var rs []received
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l == "" {
			continue
		}
		var r received
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("receiver line %q: %v", l, err)
		}
		rs = append(rs, r)
	}
	return rs
}

// waitReceived polls until every task in ids has a verified notification.
func waitReceived(t *testing.T, out string, ids []string, within time.Duration) []received {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		rs := readReceived(t, out)
		got := map[string]bool{}
		for _, r := range rs {
			if r.Verified {
				got[r.Payload.TaskID] = true
			}
		}
		missing := 0
		for _, id := range ids {
			if !got[id] {
				missing++
			}
		}
		if missing == 0 {
			return rs
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d tasks have no verified notification after %s; received %+v", missing, len(ids), within, rs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// freePort returns a loopback port nothing listens on.
func freePort(t *testing.T) int {
	t.Helper()
	addr, err := net.ResolveTCPAddr("tcp", freeLoopbackAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	return addr.Port
}

// notifySetup is a data root and a configuration for a server process that
// notifies a receiver on port with secret, which records to out.
type notifySetup struct {
	data, cfgFile, secret, out string
	port                       int
}

// mustNotifySetup writes the notify key and configuration (quick retries;
// extra lines are added under notify:) in a fresh directory.
func mustNotifySetup(t *testing.T, extra string) notifySetup {
	t.Helper()
	dir := testenv.TempDir(t)
	n := notifySetup{data: filepath.Join(dir, "data"), cfgFile: filepath.Join(dir, "corral.yaml"), secret: notify.NewSecret(),
		out: filepath.Join(dir, "received.jsonl"), port: freePort(t)}
	keyFile := filepath.Join(dir, "notify.key")
	if err := os.WriteFile(keyFile, []byte(n.secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf("notify:\n  url: http://127.0.0.1:%d/hooks/corral\n  secret_file: %s\n  initial_backoff: 100ms\n  max_backoff: 500ms\n%s", n.port, keyFile, extra)
	if err := os.WriteFile(n.cfgFile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return n
}

// notifyServer is a corral server process configured to notify.
type notifyServer struct{ *proc }

func startNotifyServer(t *testing.T, data, cfgFile string) *notifyServer {
	t.Helper()
	return &notifyServer{startProcess(t, data, "--config", cfgFile)}
}

// deliveries lists the server's deliveries in state.
func (s *notifyServer) deliveries(t *testing.T, state string) []task.Delivery {
	t.Helper()
	resp, err := http.Get(s.url + "/api/deliveries?limit=1000&state=" + state)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct{ Deliveries []task.Delivery }
	if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&body) != nil {
		t.Fatalf("GET /api/deliveries: %s", resp.Status)
	}
	return body.Deliveries
}

// spawnEnded spawns n quick tasks and waits for them to end.
func (s *notifyServer) spawnEnded(t *testing.T, n int, conv string) []string {
	t.Helper()
	var ids []string
	for i := range n {
		tk := mustSpawn(t, s.client, service.SpawnRequest{
			TaskDescription: fmt.Sprintf("task %d", i), Command: []string{"sh", "-c", "echo hi > output/a.txt"},
			ConversationID: conv, InterfaceType: "test", UserName: "alice",
		})
		ids = append(ids, tk.ID)
	}
	for _, id := range ids {
		res, err := s.client.Result(context.Background(), service.ResultRequest{TaskID: id, Wait: 60 * time.Second})
		if err != nil || !res.Done {
			t.Fatalf("task %s did not end: %v", id, err)
		}
	}
	return ids
}

// waitRetrying polls until every pending delivery has failed at least once.
func (s *notifyServer) waitRetrying(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		n := 0
		for _, d := range s.deliveries(t, "pending") {
			if d.Attempts >= 1 && d.LastError != "" {
				n++
			}
		}
		if n >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d deliveries retrying, want %d", n, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestNotificationsSurviveReceiverAndServerCrashes(t *testing.T) {
	testenv.RequireBwrap(t)
	requireReceiver(t)
	t.Parallel()
	n := mustNotifySetup(t, "  max_attempts: 1000\n  timeout: 2s\n")
	data, cfgFile, secret, port, out := n.data, n.cfgFile, n.secret, n.port, n.out

	recv := startReceiver(t, port, secret, out)
	srv := startNotifyServer(t, data, cfgFile)

	// 1. Delivered as they end.
	first := srv.spawnEnded(t, 3, "conv-1")
	rs := waitReceived(t, out, first, 30*time.Second)
	for _, r := range rs {
		p := r.Payload
		if p.EventType != "worker_completed" || p.Status != task.Success || p.ConversationID != "conv-1" || p.UserName != "alice" ||
			p.InterfaceType != "test" || p.Source != "local" || !slices.Equal(p.OutputFiles, []string{"a.txt"}) || p.ExitCode == nil || *p.ExitCode != 0 {
			t.Errorf("notification = %+v", p)
		}
	}
	for _, id := range first {
		tk, _ := srv.client.Get(context.Background(), id)
		for _, r := range rs {
			if r.Payload.TaskID == id && tk.CompletedAt != nil {
				t.Logf("task %s: notification received %dms after its terminal event", id, r.ReceivedAtMS-tk.CompletedAt.UnixMilli())
			}
		}
	}

	// 2. The receiver dies: the deliveries retry and arrive once it is back.
	recv.kill()
	second := srv.spawnEnded(t, 3, "conv-2")
	srv.waitRetrying(t, 3)
	recv = startReceiver(t, port, secret, out)
	waitReceived(t, out, second, 30*time.Second)

	// 3. The receiver is down and the server is killed with deliveries
	// pending: a restart delivers them.
	recv.kill()
	third := srv.spawnEnded(t, 3, "conv-3")
	srv.waitRetrying(t, 3)
	srv.kill()
	recv = startReceiver(t, port, secret, out)
	srv = startNotifyServer(t, data, cfgFile)
	rs = waitReceived(t, out, third, 30*time.Second)

	// Each task ends in exactly one notification id, and every request
	// the receiver got verified.
	all := slices.Concat(first, second, third)
	idsByTask := map[string]map[string]bool{}
	for _, r := range rs {
		if !r.Verified {
			t.Errorf("the receiver could not verify a notification: %s", r.Error)
			continue
		}
		if idsByTask[r.Payload.TaskID] == nil {
			idsByTask[r.Payload.TaskID] = map[string]bool{}
		}
		idsByTask[r.Payload.TaskID][r.WebhookID] = true
	}
	if len(idsByTask) != len(all) {
		t.Errorf("notifications for %d tasks, want %d", len(idsByTask), len(all))
	}
	for _, id := range all {
		if n := len(idsByTask[id]); n != 1 {
			t.Errorf("task %s: %d distinct webhook-ids, want exactly 1", id, n)
		}
	}
	// The server agrees: all delivered, none pending or failed.
	deadline := time.Now().Add(10 * time.Second)
	for len(srv.deliveries(t, "delivered")) != len(all) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if got := len(srv.deliveries(t, "delivered")); got != len(all) {
		t.Errorf("%d deliveries delivered, want %d", got, len(all))
	}
	if got := srv.deliveries(t, "pending"); len(got) != 0 {
		t.Errorf("pending deliveries left: %+v", got)
	}
	// Each attempt is an event every subscriber sees.
	var attempts int
	srv.client.Events(context.Background(), service.EventsRequest{}, func(e eventstore.Event) error {
		if e.Type == task.EventDeliveryAttempted {
			attempts++
		}
		return nil
	})
	if attempts < len(all)+6 {
		t.Errorf("%d delivery_attempted events, want at least %d (one per delivery and the failed ones)", attempts, len(all)+6)
	}
}

func TestDeadLetterRetryOverHTTP(t *testing.T) {
	requireReceiver(t)
	secret := notify.NewSecret()
	keyFile := filepath.Join(t.TempDir(), "notify.key")
	if err := os.WriteFile(keyFile, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t) // nobody listens yet
	tokFile := filepath.Join(t.TempDir(), "assistant.token")
	os.WriteFile(tokFile, []byte("assistant-token"), 0o600)
	s := MustStartEnv(t, []string{}, func(c *config.Config) {
		c.Notify.URL = fmt.Sprintf("http://127.0.0.1:%d/hook", port)
		c.Notify.SecretFile = keyFile
		c.Notify.MaxAttempts = 2
		c.Notify.InitialBackoff = config.Duration(50 * time.Millisecond)
		c.Notify.MaxBackoff = config.Duration(50 * time.Millisecond)
		c.APITokens = []config.APIToken{{Name: "assistant", TokenFile: tokFile}}
	})
	client := httpapi.NewClient(s.url, "assistant-token")
	tk := mustSpawn(t, client, service.SpawnRequest{TaskDescription: "x", Command: []string{"true"}})
	var created eventstore.Event
	client.Events(context.Background(), service.EventsRequest{TaskID: tk.ID}, func(e eventstore.Event) error {
		if e.Type == task.EventCreated {
			created = e
		}
		return nil
	})
	if created.Actor != "assistant" {
		t.Errorf("task_created actor = %q, want the token's name", created.Actor)
	}

	get := func(path string) (int, string) {
		req, _ := http.NewRequest("GET", s.url+path, nil)
		req.Header.Set("Authorization", "Bearer assistant-token")
		return send(t, req)
	}
	var dead []task.Delivery
	for deadline := time.Now().Add(60 * time.Second); len(dead) == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no dead letter")
		}
		code, body := get("/api/deliveries?state=failed")
		var b struct{ Deliveries []task.Delivery }
		if code != 200 || json.Unmarshal([]byte(body), &b) != nil {
			t.Fatalf("GET /api/deliveries: %d %s", code, body)
		}
		dead = b.Deliveries
	}
	if dead[0].TaskID != tk.ID || dead[0].Attempts != 2 {
		t.Errorf("dead letter = %+v", dead[0])
	}
	// /metrics counts it, for the alerting rules (deploy/prometheus).
	code, body := get("/metrics")
	if code != 200 || metricValue(t, body, `corral_deliveries{state="failed"}`) != 1 || metricValue(t, body, "corral_delivery_attempts_failed_total") != 2 {
		t.Errorf("metrics: %d %s, want a dead letter of 2 failed attempts", code, body)
	}

	out := filepath.Join(t.TempDir(), "received.jsonl")
	startReceiver(t, port, secret, out)
	req, _ := http.NewRequest("POST", s.url+"/api/deliveries/"+dead[0].ID+"/retry", nil)
	req.Header.Set("Authorization", "Bearer assistant-token")
	if code, body := send(t, req); code != http.StatusAccepted {
		t.Fatalf("retry: %d %s", code, body)
	}
	rs := waitReceived(t, out, []string{tk.ID}, 30*time.Second)
	if rs[0].WebhookID != dead[0].ID {
		t.Errorf("webhook-id %s, want the delivery id %s", rs[0].WebhookID, dead[0].ID)
	}
	req, _ = http.NewRequest("POST", s.url+"/api/deliveries/"+dead[0].ID+"/retry", nil)
	req.Header.Set("Authorization", "Bearer assistant-token")
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, _ := send(t, req.Clone(context.Background()))
		if code == http.StatusConflict {
			break // delivered now: no second retry
		}
		if time.Now().After(deadline) {
			t.Fatalf("retry of a delivered notification: %d, want 409", code)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestNotificationSecretRotation: during a rotation (the old secret in
// notify.previous_secret_file), the official standardwebhooks library
// accepts each notification with the old secret and with the new one.
func TestNotificationSecretRotation(t *testing.T) {
	requireReceiver(t)
	oldSecret, newSecret := notify.NewSecret(), notify.NewSecret()
	dir := t.TempDir()
	oldFile, newFile := filepath.Join(dir, "old.key"), filepath.Join(dir, "new.key")
	os.WriteFile(oldFile, []byte(oldSecret), 0o600)
	os.WriteFile(newFile, []byte(newSecret), 0o600)
	port := freePort(t)
	s := MustStart(t, func(c *config.Config) {
		c.Notify.URL = fmt.Sprintf("http://127.0.0.1:%d/hook", port)
		c.Notify.SecretFile, c.Notify.PreviousSecretFile = newFile, oldFile
		c.Notify.InitialBackoff = config.Duration(50 * time.Millisecond)
		c.Notify.MaxBackoff = config.Duration(200 * time.Millisecond)
	})
	for _, secret := range []string{oldSecret, newSecret} {
		out := filepath.Join(t.TempDir(), "received.jsonl")
		r := startReceiver(t, port, secret, out)
		tk := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "x", Command: []string{"true"}})
		waitReceived(t, out, []string{tk.ID}, 30*time.Second)
		r.kill()
	}
}
