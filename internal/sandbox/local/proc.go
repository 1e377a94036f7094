//go:build linux

package local

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

// procStartTime returns field 22 of /proc/pid/stat (start time in clock
// ticks since boot). Together with the pid it names one process: a reused
// pid has a different start time.
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// comm (field 2) may contain spaces and parentheses; fields after the
	// last ')' are space separated, starting with field 3.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// procState returns field 3 of /proc/pid/stat ('R', 'S', 'Z', ...).
func procState(pid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return 0
	}
	return b[i+2]
}

// alive reports whether the process pid with start time start still runs
// (a zombie counts as exited).
func alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	st, err := procStartTime(pid)
	if err != nil || st != start {
		return false
	}
	s := procState(pid)
	return s != 0 && s != 'Z' && s != 'X'
}

// waitPidfd blocks until the process pid (with start time start) exits or
// ctx is done. It works for processes this process did not start, which is
// the case after Recover. The start time is checked after the pidfd is open,
// so a reused pid is never waited for.
func waitPidfd(ctx context.Context, pid int, start uint64) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return fmt.Errorf("open pidfd for %d: %w", pid, err)
	}
	defer unix.Close(fd)
	if !alive(pid, start) {
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

// pidNamespace returns the inode of pid's pid namespace, or 0.
func pidNamespace(pid int) uint64 {
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/"+strconv.Itoa(pid)+"/ns/pid", &st); err != nil {
		return 0
	}
	return st.Ino
}

// pidsInNamespace returns every host pid whose pid namespace is ns. It scans
// /proc: a few milliseconds on a host with a thousand processes.
func pidsInNamespace(ns uint64) []int {
	if ns == 0 {
		return nil
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pidNamespace(pid) == ns {
			pids = append(pids, pid)
		}
	}
	return pids
}

// hasChildren reports whether pid has forked a child process (or has exited,
// so that waiting longer is pointless).
func hasChildren(pid int) bool {
	p := strconv.Itoa(pid)
	b, err := os.ReadFile("/proc/" + p + "/task/" + p + "/children")
	if err != nil {
		return true
	}
	return len(strings.TrimSpace(string(b))) > 0
}
