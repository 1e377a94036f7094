package worker

import (
	"net"
	"os"
	"time"
)

// WarmUp does now what a run does the first time only, for a process that
// waits for its task (a warm sandbox's): Go's check that pidfds work,
// which clones a process the first time one is started or found; the load
// of the local time zone, which the first log line's time takes; and the
// network stack's probes (IPv4 and IPv6 sockets, the listen backlog),
// which the first listener takes, as the egress relay's is. Each is done
// once per process and costs a task nothing after this; under gVisor each
// of their system calls is a trip through its kernel.
func WarmUp() {
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		p.Release()
	}
	time.Now().Local().Zone()
	if l, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
		l.Close()
	}
}
