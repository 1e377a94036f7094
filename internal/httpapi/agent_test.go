package httpapi

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/execagent"
	"github.com/corral-dev/corral/internal/service"
)

// agentGate is a SessionGate whose AttachAgent lets an agent in when
// allow is set (it writes "hello" over the upgraded connection and closes
// it) and refuses it otherwise; it records where each dial came from.
type agentGate struct {
	mu         sync.Mutex
	allow      bool
	hostSocket []bool
}

func (g *agentGate) setAllow(allow bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.allow = allow
}

func (g *agentGate) Authorize(string, string) bool       { return false }
func (g *agentGate) AuthorizeAgent(_, token string) bool { return token == "agent-token" }
func (g *agentGate) Forward(string) (string, bool)       { return "", false }
func (g *agentGate) AttachAgent(_ context.Context, id string, hostSocket bool, upgrade func() (net.Conn, io.Reader, error)) error {
	g.mu.Lock()
	g.hostSocket = append(g.hostSocket, hostSocket)
	allow := g.allow
	g.mu.Unlock()
	if !allow {
		return fmt.Errorf("session %s runs on replica r-other, which is alive: %w", id, errdefs.ErrFailedPrecondition)
	}
	conn, _, err := upgrade()
	if err != nil {
		return err
	}
	io.WriteString(conn, "hello")
	return conn.Close()
}

// sessionsOn is a Set's Sessions: only present, its methods unused.
type sessionsOn struct{ service.Sessions }

// An exec agent refused is answered with an HTTP error, not a 101 it
// would take as a connection served (and dial again at once); one let in
// gets its 101 and the connection. The gate learns whether the agent
// dialled a unix socket (a sandbox of this host) or TCP.
func TestAgentRefusedBeforeItsUpgrade(t *testing.T) {
	gate := &agentGate{}
	b := &stub{}
	srv := New(service.Set{Tasks: b, Library: b, Sessions: sessionsOn{}}, b, Options{SessionGate: gate}, slogTo(io.Discard))
	tcp := httptest.NewServer(srv.Handler())
	defer tcp.Close()
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	unix := &http.Server{Handler: srv.WebhookHandler()}
	go unix.Serve(ln)
	defer unix.Close()

	// dial sends an agent's request and returns the answer's status and
	// what follows it.
	dial := func(network, addr string) (int, string) {
		t.Helper()
		conn, err := net.Dial(network, addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(conn, "POST /api/sessions/sess-1/agent HTTP/1.1\r\nHost: corral\r\nAuthorization: Bearer agent-token\r\n"+
			"Connection: Upgrade\r\nUpgrade: "+execagent.Upgrade+"\r\nContent-Length: 0\r\n\r\n")
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusSwitchingProtocols {
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(body)
		}
		rest, _ := io.ReadAll(br)
		return resp.StatusCode, string(rest)
	}

	for _, d := range []struct{ network, addr string }{{"tcp", tcp.Listener.Addr().String()}, {"unix", sock}} {
		gate.setAllow(false)
		if code, _ := dial(d.network, d.addr); code != http.StatusUnprocessableEntity {
			t.Errorf("%s: the agent refused was answered %d, want 422 (not 101)", d.network, code)
		}
		gate.setAllow(true)
		if code, rest := dial(d.network, d.addr); code != http.StatusSwitchingProtocols || rest != "hello" {
			t.Errorf("%s: the agent let in was answered %d, then %q; want 101, then the gate's hello", d.network, code, rest)
		}
	}
	gate.mu.Lock()
	defer gate.mu.Unlock()
	if want := []bool{false, false, true, true}; fmt.Sprint(gate.hostSocket) != fmt.Sprint(want) {
		t.Errorf("the gate was told the dials came on the host's socket: %v, want %v", gate.hostSocket, want)
	}
}
