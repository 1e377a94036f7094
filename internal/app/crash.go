package app

import (
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
)

// crashHook is the runtimes' and the scheduler's Options.Crash for the
// fault tests' kill point (config CrashAt, from CORRAL_TEST_CRASH_AT): at
// point it kills this process with SIGKILL, as an operator's kill -9 or
// the OOM killer would, with nothing flushed or undone. nil when point is
// "", as in production.
func crashHook(point string, log *slog.Logger) func(string) {
	if point == "" {
		return nil
	}
	return func(p string) {
		if p != point {
			return
		}
		log.Warn("fault test: killing the server", "crash_point", p)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // this goroutine goes no further while the kill lands
	}
}

// crashAt is hook bound to point, for a part that has that one kill point;
// nil when hook is.
func crashAt(hook func(string), point string) func() {
	if hook == nil {
		return nil
	}
	return func() { hook(point) }
}

// checkCrashPoint refuses a kill point that is none of sandbox.CrashPoints,
// ClusterCrashPoints, SessionCrashPoints and KubernetesCrashPoints.
func checkCrashPoint(point string) error {
	points := slices.Concat(sandbox.CrashPoints, sandbox.ClusterCrashPoints, sandbox.SessionCrashPoints, sandbox.KubernetesCrashPoints)
	if point == "" || slices.Contains(points, point) {
		return nil
	}
	return &errdefs.FieldError{Field: "CORRAL_TEST_CRASH_AT", Err: fmt.Errorf("%q is not one of %s: %w", point, strings.Join(points, ", "), errdefs.ErrInvalidArgument)}
}
