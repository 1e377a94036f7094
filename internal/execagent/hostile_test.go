package execagent

import (
	"bufio"
	"context"
	"io"
	"net"
	"strings"
	"testing"
)

// TestHostileAgent: what an agent sends is bounded. A frame over MaxFrame
// ends the connection (an Exec on it ends, unavailable) rather than
// growing the server's memory, and an exit frame's error text is clipped.
func TestHostileAgent(t *testing.T) {
	for name, frame := range map[string]string{
		"oversized frame": `{"op":"out","id":"e1","fd":1,"data":"` + strings.Repeat("A", MaxFrame) + `"}` + "\n",
		"long error":      `{"op":"exit","id":"e1","code":127,"error":"` + strings.Repeat("x", 100000) + `"}` + "\n",
	} {
		t.Run(name, func(t *testing.T) {
			server, agent := net.Pipe()
			c := NewConn(server, server)
			t.Cleanup(func() { c.Close(); agent.Close() })
			go func() {
				// Read the start frame, then answer with the hostile one.
				bufio.NewReader(agent).ReadString('\n')
				io.WriteString(agent, frame)
			}()
			_, err := c.Exec(context.Background(), []string{"true"}, "/", nil, nil, io.Discard, io.Discard)
			if err == nil {
				t.Fatal("Exec succeeded")
			}
			if len(err.Error()) > maxError+200 {
				t.Errorf("the error carries %d bytes of the agent's text", len(err.Error()))
			}
			if name == "oversized frame" && !strings.Contains(err.Error(), "went away") {
				t.Errorf("an oversized frame: %v, want the connection ended", err)
			}
		})
	}
}
