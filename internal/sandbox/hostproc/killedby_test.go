package hostproc

import (
	"syscall"
	"testing"
)

func TestKilledBy(t *testing.T) {
	for sig, want := range map[syscall.Signal]string{
		syscall.SIGKILL:    "killed by SIGKILL (signal 9)",
		syscall.SIGTERM:    "killed by SIGTERM (signal 15)",
		syscall.Signal(77): "killed by signal 77",
	} {
		if got := KilledBy(sig); got != want {
			t.Errorf("KilledBy(%d) = %q, want %q", int(sig), got, want)
		}
	}
}
