package servicetest

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
)

// RunSessions runs the session contract's checks against each
// implementation; newImpl returns one whose default runtime can start a
// session (a real sandbox: the session manager of a running server, or a
// client of one).
func RunSessions(t *testing.T, impls map[string]func(*testing.T) service.Sessions) {
	checks := map[string]func(*testing.T, service.Sessions){
		"Lifecycle": checkSessionLifecycle,
		"Refusals":  checkSessionRefusals,
	}
	for impl, newImpl := range impls {
		for name, check := range checks {
			t.Run(impl+"/"+name, func(t *testing.T) { check(t, newImpl(t)) })
		}
	}
}

// createSession starts a session that the test's end deletes.
func createSession(t *testing.T, sess service.Sessions, req service.CreateSessionRequest) (service.Session, string) {
	t.Helper()
	s, token, err := sess.Create(context.Background(), req)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { sess.Delete(context.Background(), s.ID) })
	return s, token
}

// collected is what ExecBounded's onOutput was given, by stream.
type collected struct {
	mu      sync.Mutex
	streams map[string][]byte
}

func (c *collected) add(stream string, data []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.streams == nil {
		c.streams = map[string][]byte{}
	}
	c.streams[stream] = append(c.streams[stream], data...)
}

func checkSessionLifecycle(t *testing.T, sess service.Sessions) {
	ctx := context.Background()
	s, token := createSession(t, sess, service.CreateSessionRequest{Labels: map[string]string{"who": "servicetest"}})
	if s.Status != service.SessionRunning || !strings.HasPrefix(token, service.SessionTokenPrefix) || s.Labels["who"] != "servicetest" {
		t.Fatalf("Create: %+v, token %q", s, token)
	}
	got, err := sess.Get(ctx, s.ID)
	if err != nil || got.ID != s.ID || got.Status != service.SessionRunning {
		t.Errorf("Get: %+v, %v", got, err)
	}
	list, err := sess.List(ctx)
	if err != nil || !slices.ContainsFunc(list, func(l service.Session) bool { return l.ID == s.ID }) {
		t.Errorf("List: %d sessions, %v; want one of them %s", len(list), err, s.ID)
	}

	// An argv, its streams apart and its exit code.
	var out, errb bytes.Buffer
	end, err := sess.Exec(ctx, s.ID, service.SessionCommand{Command: []string{"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}}, &out, &errb)
	if err != nil || end.ExitCode != 3 || out.String() != "out\n" || errb.String() != "err\n" || end.StdoutBytes != 4 || !strings.HasPrefix(end.ExecID, "exec-") {
		t.Errorf("Exec: %+v, stdout %q, stderr %q, %v; want exit 3, out, err", end, out.String(), errb.String(), err)
	}
	// A shell line with its environment, stdin and working directory; the
	// session's directory by default.
	out.Reset()
	end, err = sess.Exec(ctx, s.ID, service.SessionCommand{Shell: `read l; echo "$l $G $(pwd)"`, Env: []string{"G=world"}, Stdin: strings.NewReader("hello\n"), Dir: "/"}, &out, &errb)
	if err != nil || end.ExitCode != 0 || out.String() != "hello world /\n" {
		t.Errorf("Exec with env, stdin and cwd: %+v, stdout %q, %v; want %q", end, out.String(), err, "hello world /\n")
	}
	out.Reset()
	if _, err := sess.Exec(ctx, s.ID, service.SessionCommand{Shell: "pwd"}, &out, &errb); err != nil || out.String() != service.SessionDir+"\n" {
		t.Errorf("a command starts in %q, %v; want %s", out.String(), err, service.SessionDir)
	}

	// workspace_exec keeps max bytes of each stream and says so; every
	// chunk goes to onOutput whole.
	var seen collected
	res, err := sess.ExecBounded(ctx, service.SessionExecRequest{SessionID: s.ID, Command: "printf 0123456789; printf abc >&2"}, 4, seen.add)
	if err != nil || res.ExitCode != 0 || res.Stdout != "0123" || !res.StdoutTruncated || res.Stderr != "abc" || res.StderrTruncated {
		t.Errorf("ExecBounded: %+v, %v; want stdout 0123 cut, stderr abc whole", res, err)
	}
	if string(seen.streams["stdout"]) != "0123456789" || string(seen.streams["stderr"]) != "abc" {
		t.Errorf("onOutput got stdout %q, stderr %q; want every byte", seen.streams["stdout"], seen.streams["stderr"])
	}
	// A command past its timeout is stopped, with the code timeout(1) uses.
	start := time.Now()
	res, err = sess.ExecBounded(ctx, service.SessionExecRequest{SessionID: s.ID, Command: "sleep 30", TimeoutSeconds: 1}, 1024, nil)
	if err != nil || res.ExitCode != 124 || time.Since(start) > 20*time.Second {
		t.Errorf("ExecBounded past its timeout: %+v after %s, %v; want exit 124 after about 1 s", res, time.Since(start), err)
	}
	if got, err := sess.Get(ctx, s.ID); err != nil || got.Execs != 5 {
		t.Errorf("after five commands: %d execs, %v", got.Execs, err)
	}

	if err := sess.Delete(ctx, s.ID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	got, err = sess.Get(ctx, s.ID)
	if err != nil || got.Status != service.SessionEnded || got.EndReason != "deleted" || got.EndedAt == nil {
		t.Errorf("Get after Delete: %+v, %v; want ended, deleted", got, err)
	}
	_, err = sess.Exec(ctx, s.ID, service.SessionCommand{Shell: "true"}, &out, &errb)
	wantClass(t, "Exec in an ended session", err, errdefs.ErrNotFound)
	if err := sess.Delete(ctx, s.ID); err != nil {
		t.Errorf("Delete of an ended session: %v, want none", err)
	}
}

func checkSessionRefusals(t *testing.T, sess service.Sessions) {
	ctx := context.Background()
	const unknown = "sess-00000000000000000000000000"
	_, err := sess.Get(ctx, unknown)
	wantClass(t, "Get of an unknown session", err, errdefs.ErrNotFound)
	var out, errb bytes.Buffer
	_, err = sess.Exec(ctx, unknown, service.SessionCommand{Shell: "true"}, &out, &errb)
	wantClass(t, "Exec in an unknown session", err, errdefs.ErrNotFound)
	err = sess.Delete(ctx, unknown)
	wantClass(t, "Delete of an unknown session", err, errdefs.ErrNotFound)
	for what, req := range map[string]service.CreateSessionRequest{
		"an unknown runtime":      {Runtime: "nosuch"},
		"an unknown network":      {Network: "bogus"},
		"a label of Corral's own": {Labels: map[string]string{"corral.session-id": "x"}},
		"a negative idle timeout": {IdleTimeout: -1},
	} {
		_, _, err := sess.Create(ctx, req)
		wantClass(t, "Create with "+what, err, errdefs.ErrInvalidArgument)
	}

	s, _ := createSession(t, sess, service.CreateSessionRequest{})
	for what, req := range map[string]service.SessionCommand{
		"no command":             {},
		"a relative cwd":         {Shell: "true", Dir: "tmp"},
		"a timeout over a day":   {Shell: "true", Timeout: 25 * time.Hour},
		"an environment unnamed": {Shell: "true", Env: []string{"=x"}},
	} {
		_, err := sess.Exec(ctx, s.ID, req, &out, &errb)
		wantClass(t, "Exec with "+what, err, errdefs.ErrInvalidArgument)
	}
	_, err = sess.ExecBounded(ctx, service.SessionExecRequest{SessionID: s.ID, Command: "  "}, 1024, nil)
	wantClass(t, "ExecBounded of a blank command", err, errdefs.ErrInvalidArgument)
	// None of the refused commands ran.
	if got, err := sess.Get(ctx, s.ID); err != nil || got.Execs != 0 || got.Status != service.SessionRunning {
		t.Errorf("after refused commands: %+v, %v; want a running session with no exec", got, err)
	}
}
