package egress

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestSetPolicy: a policy that no longer lets an open tunnel through
// closes it before SetPolicy returns, and refuses the next CONNECT; one
// that lets the target through again lets the next one in. A relay to a
// model API the new policy has not is closed too; one whose API stays
// stays open.
func TestSetPolicy(t *testing.T) {
	dir, err := os.MkdirTemp("", "egress")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	srv, err := NewServer(dir, Options{}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	a, b := echoServer(t), echoServer(t)
	hostA, hostB := "127.0.0.1:"+strconv.Itoa(a), "127.0.0.1:"+strconv.Itoa(b)
	api := mustModel(t, "http://127.0.0.1:9/v1", "x-api-key", "k")
	wide := Policy{Allow: MustParseRules(hostA, hostB), Models: []Model{api}}
	d, err := srv.Open("t1", wide)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(d, SocketName)
	if err := srv.SetPolicy("t2", wide); err == nil {
		t.Error("SetPolicy of a task without a proxy: no error")
	}

	_, brA, status, _ := connect(t, sock, hostA)
	cb, brB, statusB, _ := connect(t, sock, hostB)
	_, relayBr, statusR, _ := connect(t, sock, ModelHost(0)+":80")
	if status != 200 || statusB != 200 || statusR != 200 {
		t.Fatalf("CONNECTs: %d %d %d", status, statusB, statusR)
	}
	// Narrowed: A and the model API go, B stays.
	if err := srv.SetPolicy("t1", Policy{Allow: MustParseRules(hostB)}); err != nil {
		t.Fatal(err)
	}
	for name, br := range map[string]io.Reader{"the tunnel to A": brA, "the model API's relay": relayBr} {
		done := make(chan error, 1)
		go func() { _, err := br.Read(make([]byte, 1)); done <- err }()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("%s read data after the narrowing", name)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s still open 5 s after the narrowing", name)
		}
	}
	if _, err := io.WriteString(cb, "still"); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 5)
	if _, err := io.ReadFull(brB, got); err != nil || string(got) != "still" {
		t.Errorf("the tunnel to B, still allowed: %q %v", got, err)
	}
	if _, _, status, _ := connect(t, sock, hostA); status != 403 {
		t.Errorf("CONNECT to A after the narrowing: %d, want 403", status)
	}
	if _, _, status, _ := connect(t, sock, ModelHost(0)+":80"); status != 403 {
		t.Errorf("relay after the model API went: %d, want 403", status)
	}
	// Widened again: A is let in.
	if err := srv.SetPolicy("t1", wide); err != nil {
		t.Fatal(err)
	}
	if _, _, status, _ := connect(t, sock, hostA); status != 200 {
		t.Errorf("CONNECT to A after the widening: %d, want 200", status)
	}
}
