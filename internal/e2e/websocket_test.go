//go:build integration

package e2e_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// wsAgent is an agent that speaks WebSocket to its model API, as a
// Realtime API's client does: bash's /dev/tcp to the base URL the worker
// gave it (its relay on the sandbox's loopback), an upgrade with a
// placeholder key, one line sent over the upgraded connection and the
// answer read back and printed as the CLI's message. It runs as the codex agent's binary,
// bash, from BASH_ENV, which bash runs before the script its arguments
// name (the CLI's "exec"), and exits there.
const wsAgent = `set -e
hp=${OPENAI_BASE_URL#http://}; hp=${hp%%/*}
exec 3<>"/dev/tcp/${hp%:*}/${hp##*:}"
printf 'GET /realtime HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nAuthorization: Bearer placeholder\r\n\r\n' "$hp" >&3
read -r status <&3
while read -r line <&3 && [ "${line%$'\r'}" != "" ]; do :; done
printf 'hello over the socket\n' >&3
read -r back <&3
printf '{"type":"item.completed","item":{"id":"item_1","type":"agent_message","text":"%s / %s"}}\n' "${status%$'\r'}" "$back"
exit 0
`

// wsKey is the model API's key the server holds.
const wsKey = "sk-ws-test-8d3a61f0c2"

// TestModelWebSocketThroughEgress: an agent's WebSocket to its model API
// goes through the worker's relay and the egress proxy, which adds the
// key to the handshake; the API's 101 comes back, bytes flow both ways,
// and the task's egress record says 101, with the key, and counts them.
// The relay answered such an upgrade with 502 before.
func TestModelWebSocketThroughEgress(t *testing.T) {
	for _, rt := range []string{"local", "gvisor"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "gvisor" {
				testenv.RequireRunsc(t)
			}
			t.Parallel()
			keys := make(chan string, 4)
			ln, err := net.Listen("tcp", "127.0.0.2:0")
			if err != nil {
				t.Fatal(err)
			}
			api := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				keys <- r.Header.Get("Authorization")
				c, brw, err := http.NewResponseController(w).Hijack()
				if err != nil {
					return
				}
				defer c.Close()
				io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
				if line, err := brw.ReadString('\n'); err == nil {
					io.WriteString(c, strings.ToUpper(line))
				}
				// The agent closes its side once it has the answer.
				c.SetReadDeadline(time.Now().Add(30 * time.Second))
				bufio.NewReader(brw).ReadString('\n')
			})}
			go api.Serve(ln)
			t.Cleanup(func() { api.Close() })
			addr := ln.Addr().String()
			s := MustStart(t, func(c *config.Config) {
				c.Egress.Mode = "allowlist"
				c.Egress.Allow = []string{addr}
				c.Agents.Codex = config.Agent{Binary: "bash", Env: map[string]string{
					"OPENAI_BASE_URL": "http://" + addr + "/v1",
					"OPENAI_API_KEY":  wsKey,
					"BASH_ENV":        "/task/context/ws.sh",
				}}
			})
			shared := filepath.Join(s.data, "shared")
			if err := os.MkdirAll(shared, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(shared, "ws.sh"), []byte(wsAgent), 0o644); err != nil {
				t.Fatal(err)
			}
			tk, _, err := s.client.Spawn(t.Context(), service.SpawnRequest{TaskDescription: "talk over a websocket", Agent: "codex", Network: "allowlist", Runtime: rt, ContextFiles: []string{"ws.sh"}})
			if err != nil {
				t.Fatal(err)
			}
			res := s.wait(t, tk.ID, 2*time.Minute)
			if res.Status != task.Success || !strings.Contains(res.Summary, "HTTP/1.1 101 Switching Protocols / HELLO OVER THE SOCKET") {
				t.Fatalf("task %s: %q, summary %q: want the 101 and the answer over the upgraded connection", res.Status, res.ErrorMessage, res.Summary)
			}
			if k := <-keys; k != "Bearer "+wsKey {
				t.Errorf("the handshake reached the API with Authorization %q, want the server's key", k)
			}
			egressEvents(t, s.client, tk.ID, func(cs []task.EgressConnection) bool {
				return slices.ContainsFunc(cs, func(c task.EgressConnection) bool {
					return c.Method == "GET" && c.Path == "/realtime" && c.Status == http.StatusSwitchingProtocols && c.Credential && c.Allowed &&
						c.BytesUp >= int64(len("hello over the socket\n")) && c.BytesDown >= int64(len("HELLO OVER THE SOCKET\n"))
				})
			})
			assertSecretAbsent(t, s, tk.ID, wsKey)
		})
	}
}
