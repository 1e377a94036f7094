package worker

import (
	"context"
	"net"
	"os"
	"os/exec"
	"time"
)

// primeTimeout bounds WarmUp's process start (primeStart).
const primeTimeout = 10 * time.Second

// WarmUp does now what a run does the first time only, for a process that
// waits for its task (a warm sandbox's): Go's check that pidfds work,
// which clones a process the first time one is started or found; the load
// of the local time zone, which the first log line's time takes; the
// network stack's probes (IPv4 and IPv6 sockets, the listen backlog),
// which the first listener takes, as the egress relay's is; and, under
// gVisor, the sandbox's first process start (primeStart). Each is done
// once per process or sandbox and costs a task nothing after this; under
// gVisor each of their system calls is a trip through its kernel.
func WarmUp() {
	if p, err := os.FindProcess(os.Getpid()); err == nil {
		p.Release()
	}
	time.Now().Local().Zone()
	if l, err := net.Listen("tcp", "127.0.0.1:0"); err == nil {
		l.Close()
	}
	primeStart()
}

// primeStart runs `env true` found on PATH, with this process's
// environment less Corral's variables (a warm sandbox's is the default
// environment every task's starts from, LANG included), and waits for it:
// what almost every command's start reads (the dynamic linker, the C
// library, the locale LANG names, a look-up on PATH) is then read once
// before any task. Only under a kernel of the sandbox's own (gVisor, told
// from Linux's by environGuarded): its file cache is the sandbox's, which
// the first process start fills through the gofer, file by file, and a
// task's command started some 5 ms sooner there (docs/benchmarks.md).
// Under Linux's (bubblewrap, runc) the host's cache has them already,
// and the process start would only take CPU from the tasks running. A
// sandbox without env (a bare image) skips it; its failure is nobody's
// concern.
func primeStart() {
	if environGuarded() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), primeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "env", "true") // not on PATH: Run fails at once
	cmd.Env = agentEnv(os.Environ(), nil)
	cmd.Dir = "/"
	cmd.Run()
}
