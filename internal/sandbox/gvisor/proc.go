//go:build linux

package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// procStat returns the fields of /proc/pid/stat after the command name:
// field 3 (the state) is [0], field 22 (the start time) is [19].
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	// comm (field 2) may contain spaces and parentheses.
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

// procStartTime returns pid's start time in clock ticks since boot; with
// the pid it names one process, as a reused pid starts later.
func procStartTime(pid int) (uint64, error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// alive reports whether the process pid with start time start still runs
// (a zombie counts as exited).
func alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	f, err := procStat(pid)
	if err != nil || f[19] != strconv.FormatUint(start, 10) {
		return false
	}
	return f[0] != "Z" && f[0] != "X"
}

// waitPidfd blocks until the process pid (with start time start) exits or
// ctx is done. It works for processes this process did not start, as after
// Recover. The start time is checked after the pidfd is open, so a reused
// pid is never waited for.
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
	// Poll in slices so ctx cancellation is noticed within 100 ms.
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
