package sandbox

import (
	"fmt"
	"strings"
	"syscall"
	"unicode"

	"github.com/corral-dev/corral/internal/clip"
)

// ExitMessage is ExitStatus.Message for a process that ended with code,
// when its runtime knows no better (an OOM kill, an engine's error): the
// signal that ended it (128 plus the signal, 129 to 192), else, for a
// failure, its last words, LastWords of output() (read only then; nil:
// none); "" for a success.
func ExitMessage(code int, output func() []byte) string {
	switch {
	case code > 128 && code < 128+65:
		return KilledBy(syscall.Signal(code - 128))
	case code > 0 && output != nil:
		return LastWords(output())
	}
	return ""
}

// KilledBy is ExitStatus.Message for a process a signal ended: "killed by
// SIGKILL (signal 9)", not Go's "killed by signal killed".
func KilledBy(sig syscall.Signal) string {
	if name, ok := signalNames[sig]; ok {
		return fmt.Sprintf("killed by %s (signal %d)", name, int(sig))
	}
	return fmt.Sprintf("killed by signal %d", int(sig))
}

// signalNames are the POSIX signals' names, by this architecture's
// numbers. (golang.org/x/sys/unix has them too, but this package is the
// scheduler's, which stays clear of it.)
var signalNames = map[syscall.Signal]string{
	syscall.SIGABRT: "SIGABRT", syscall.SIGALRM: "SIGALRM", syscall.SIGBUS: "SIGBUS", syscall.SIGCHLD: "SIGCHLD",
	syscall.SIGCONT: "SIGCONT", syscall.SIGFPE: "SIGFPE", syscall.SIGHUP: "SIGHUP", syscall.SIGILL: "SIGILL",
	syscall.SIGINT: "SIGINT", syscall.SIGIO: "SIGIO", syscall.SIGKILL: "SIGKILL", syscall.SIGPIPE: "SIGPIPE",
	syscall.SIGPROF: "SIGPROF", syscall.SIGQUIT: "SIGQUIT", syscall.SIGSEGV: "SIGSEGV", syscall.SIGSTOP: "SIGSTOP",
	syscall.SIGSYS: "SIGSYS", syscall.SIGTERM: "SIGTERM", syscall.SIGTRAP: "SIGTRAP", syscall.SIGTSTP: "SIGTSTP",
	syscall.SIGTTIN: "SIGTTIN", syscall.SIGTTOU: "SIGTTOU", syscall.SIGURG: "SIGURG", syscall.SIGUSR1: "SIGUSR1",
	syscall.SIGUSR2: "SIGUSR2", syscall.SIGVTALRM: "SIGVTALRM", syscall.SIGWINCH: "SIGWINCH", syscall.SIGXCPU: "SIGXCPU",
	syscall.SIGXFSZ: "SIGXFSZ",
}

// LastWords is what a sandbox's main process said last about why it
// ended, in out, the end of its output: a Go program's "panic:" or "fatal
// error:" line, with the "runtime:" lines just before it (a worker that
// could not start a thread says why there), else the last line. On one
// line, valid UTF-8, without control characters, at most 300 bytes; ""
// for none. Only the last LastWordsWindow bytes of out are read. The
// sandbox wrote them: it is a message, never parsed.
func LastWords(out []byte) string {
	out = out[max(len(out)-LastWordsWindow, 0):]
	lines := strings.Split(strings.ToValidUTF8(string(out), "\uFFFD"), "\n")
	said := ""
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if strings.HasPrefix(l, "panic: ") || strings.HasPrefix(l, "fatal error: ") {
			j := i
			for j > 0 && strings.HasPrefix(lines[j-1], "runtime: ") {
				j--
			}
			said = strings.Join(lines[j:i+1], "; ")
			break
		}
		if said == "" && l != "" {
			said = l
		}
	}
	return clip.Line(strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, said), 300)
}

// LastWordsWindow is how much of the end of a sandbox's output LastWords
// reads.
const LastWordsWindow = 64 << 10
