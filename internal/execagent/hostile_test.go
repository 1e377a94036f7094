package execagent

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// recorder is a Handler that keeps what it is given.
type recorder struct {
	exits  chan string
	output int
}

func (r *recorder) Hello([]ExecState)                         {}
func (r *recorder) Resume(string) (int64, bool)               { return 0, false }
func (r *recorder) Exit(_ string, _ int, msg string, _ int64) { r.exits <- msg }
func (r *recorder) Output(_ string, _ int, off int64, data []byte) int64 {
	r.output += len(data)
	return off + int64(len(data))
}

// TestHostileAgent: what an agent sends is bounded. A frame over MaxFrame,
// a hello naming too many commands, an output frame of another stream or
// offset end the connection rather than growing the server's memory, and
// an exit frame's error text is clipped.
func TestHostileAgent(t *testing.T) {
	many := `{"op":"hello","execs":[` + strings.Repeat(`{"id":"x","off":0},`, maxHello) + `{"id":"y","off":0}]}`
	for name, frame := range map[string]string{
		"oversized frame": `{"op":"out","id":"e1","fd":1,"data":"` + strings.Repeat("A", MaxFrame) + `"}`,
		"long hello":      many,
		"stream 3":        `{"op":"out","id":"e1","fd":3,"data":"QQ=="}`,
		"offset below 0":  `{"op":"out","id":"e1","fd":1,"off":-5,"data":"QQ=="}`,
		"long error":      `{"op":"exit","id":"e1","code":127,"error":"` + strings.Repeat("x", 100000) + `"}`,
	} {
		t.Run(name, func(t *testing.T) {
			server, agent := net.Pipe()
			r := &recorder{exits: make(chan string, 1)}
			c := NewConn(server, server, r)
			c.Serve()
			t.Cleanup(func() { c.Close(); agent.Close() })
			go func() {
				io.WriteString(agent, frame+"\n")
				io.Copy(io.Discard, agent)
			}()
			select {
			case msg := <-r.exits:
				if name != "long error" || len(msg) > maxError+16 {
					t.Errorf("%s: an exit of %d bytes", name, len(msg))
				}
			case <-c.Done():
				if name == "long error" || r.output != 0 {
					t.Errorf("%s: the connection ended (%d bytes of output taken)", name, r.output)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("%s: neither an exit nor the end", name)
			}
		})
	}
}
