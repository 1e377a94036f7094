//go:build linux

// Package hostproc reads the host's /proc for the host runtimes
// (sandbox/local, sandbox/gvisor): it names a process by its pid and start
// time, so that a reused pid is never mistaken for it, tells whether that
// process still runs, and waits for it to exit although the server did not
// start it (after a restart).
package hostproc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// stat returns the fields of /proc/pid/stat after the command name: field 3
// (the state) is [0], field 22 (the start time) is [19].
func stat(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	// comm (field 2) may contain spaces and parentheses; fields after the
	// last ')' are space separated, starting with field 3.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return nil, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return nil, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	return f, nil
}

// StartTime returns pid's start time in clock ticks since boot (field 22 of
// /proc/pid/stat). With the pid it names one process: a reused pid has a
// different start time.
func StartTime(pid int) (uint64, error) {
	f, err := stat(pid)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// Alive reports whether the process pid with start time start still runs
// (a zombie counts as exited).
func Alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	f, err := stat(pid)
	if err != nil || f[19] != strconv.FormatUint(start, 10) {
		return false
	}
	return f[0] != "Z" && f[0] != "X"
}

// Wait blocks until the process pid (with start time start) exits or ctx is
// done. It works for processes this process did not start. The start time
// is checked after the pidfd is open, so a reused pid is never waited for.
func Wait(ctx context.Context, pid int, start uint64) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return fmt.Errorf("open pidfd for %d: %w", pid, err)
	}
	defer unix.Close(fd)
	if !Alive(pid, start) {
		return nil
	}
	// Poll in slices so ctx cancellation is noticed within 100 ms without
	// a second fd to wake the poll.
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 100)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return fmt.Errorf("poll pidfd for %d: %w", pid, err)
		}
		if n > 0 {
			return nil
		}
	}
}

// Running reports whether a runtime's launcher process still runs. done is
// closed once this server reaped the process it started; it is nil for a
// process started before a restart (recovered), and then /proc decides.
func Running(done <-chan struct{}, pid int, start uint64) bool {
	if done != nil {
		select {
		case <-done:
			return false
		default:
			return true
		}
	}
	return Alive(pid, start)
}

// WaitExit blocks until a runtime's launcher process exits (done, as for
// Running, is closed or, when nil, Wait returns) or ctx is done.
func WaitExit(ctx context.Context, done <-chan struct{}, pid int, start uint64) error {
	if done != nil {
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return Wait(ctx, pid, start)
}

// PidNamespace returns the inode of pid's pid namespace, or 0.
func PidNamespace(pid int) uint64 {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/"+strconv.Itoa(pid)+"/ns/pid", &st); err != nil {
		return 0
	}
	return st.Ino
}

// PidsInNamespace returns every host pid whose pid namespace is ns. It
// scans /proc: a few milliseconds on a host with a thousand processes.
func PidsInNamespace(ns uint64) []int {
	var pids []int
	scan(ns, func(pid int) { pids = append(pids, pid) })
	return pids
}

// scan calls fn with every host pid whose pid namespace is ns, in
// ascending order.
func scan(ns uint64, fn func(pid int)) {
	if ns == 0 {
		return
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if PidNamespace(pid) == ns {
			fn(pid)
		}
	}
}

// PidNS is a pid namespace held open. The inode number that names a
// namespace is given to a new one (of any kind) once it is gone; held,
// it is not, so the processes /proc shows with that number are this
// namespace's, also when the last of them has just exited.
type PidNS struct {
	f   *os.File
	ino uint64
}

// OpenPidNS holds the pid namespace of process pid if its inode number is
// ino; it returns nil if pid is gone or in another namespace. The caller
// closes it.
func OpenPidNS(pid int, ino uint64) *PidNS {
	if pid <= 0 || ino == 0 {
		return nil
	}
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/pid")
	if err != nil {
		return nil
	}
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil || st.Ino != ino {
		f.Close()
		return nil
	}
	return &PidNS{f: f, ino: ino}
}

// Close lets the namespace go.
func (n *PidNS) Close() {
	if n != nil {
		n.f.Close()
	}
}

// pfExiting is PF_EXITING in the flags of /proc/pid/stat: the process is
// in exit (or a zombie), and runs nothing of its own any more.
const pfExiting = 0x4

// exiting reports whether pid is gone, or exiting or a zombie.
func exiting(pid int) bool {
	f, err := stat(pid)
	if err != nil {
		return true
	}
	flags, err := strconv.ParseUint(f[6], 10, 64) // field 9
	return err != nil || flags&pfExiting != 0 || f[0] == "Z" || f[0] == "X"
}

// Signal sends sig to every process in the namespace that is not exiting
// already and returns how many it sent it to: 0 means none is left that
// runs anything of its own (a process killed in a system call finishes
// that call first, and counts until then). Each process is held by a
// pidfd while its namespace is checked, so a pid that a process outside
// the namespace took meanwhile is never signalled. Pids go in ascending
// order: a namespace's pid 1, whose death the kernel makes every other's,
// usually first.
func (n *PidNS) Signal(sig syscall.Signal) int {
	sent := 0
	scan(n.ino, func(pid int) {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			return
		}
		defer unix.Close(fd)
		if PidNamespace(pid) == n.ino && !exiting(pid) && unix.PidfdSendSignal(fd, sig, nil, 0) == nil {
			sent++
		}
	})
	return sent
}

// ExecWatch polls whether a process's child has executed another program
// than the process's own (its command name differs), as a forked child
// does once it is set up. Once the child is known, a poll reads one small
// /proc file.
type ExecWatch struct {
	pid   int
	own   string // pid's command name, read at the first poll
	child string // the first child's pid, once pid has one
}

// WatchExec watches pid's first child; pid should have no other.
func WatchExec(pid int) *ExecWatch { return &ExecWatch{pid: pid} }

// Done reports whether the child has executed another program, or pid or
// the child is gone, so that waiting longer is pointless.
func (w *ExecWatch) Done() bool {
	p := strconv.Itoa(w.pid)
	if w.own == "" {
		own, err := os.ReadFile("/proc/" + p + "/comm")
		if err != nil {
			return true
		}
		w.own = string(own)
	}
	if w.child == "" {
		b, err := os.ReadFile("/proc/" + p + "/task/" + p + "/children")
		if err != nil {
			return true
		}
		kids := strings.Fields(string(b))
		if len(kids) == 0 {
			return false
		}
		w.child = kids[0]
	}
	comm, err := os.ReadFile("/proc/" + w.child + "/comm")
	return err != nil || string(comm) != w.own
}
