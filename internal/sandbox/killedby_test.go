package sandbox

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

func TestExitMessage(t *testing.T) {
	output := func() []byte { return []byte("starting\npanic: boom\ngoroutine 1 [running]:\n") }
	for _, c := range []struct {
		code   int
		output func() []byte
		want   string
	}{
		{0, output, ""},
		{-1, output, ""},
		{2, output, "panic: boom"},
		{2, nil, ""},
		{137, output, "killed by SIGKILL (signal 9)"},
		{192, output, "killed by signal 64"},
		{193, output, "panic: boom"},
		{255, func() []byte { return nil }, ""},
	} {
		if got := ExitMessage(c.code, c.output); got != c.want {
			t.Errorf("ExitMessage(%d) = %q, want %q", c.code, got, c.want)
		}
	}
}
