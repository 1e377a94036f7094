package worker

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/workerproto"
)

// TestWarmUpLeavesNothingOpen: a warm sandbox's worker holds nothing of
// what it warmed up (the pidfd of its own, the loopback listener) once
// WarmUp returns.
func TestWarmUpLeavesNothingOpen(t *testing.T) {
	fds := func() []string {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range ents {
			if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil {
				names = append(names, e.Name()+" "+target)
			}
		}
		slices.Sort(names)
		return names
	}
	before := fds()
	WarmUp()
	if after := fds(); !slices.Equal(before, after) {
		t.Errorf("descriptors before WarmUp %q, after %q", before, after)
	}
}

// TestPrimeStart: under a kernel of the sandbox's own (gVisor) the prime
// is `env true` from PATH, run to its end with the process's environment
// less Corral's variables (a warm sandbox's worker holds no task's secret,
// but a warm pod's has its claim token); under Linux's it is not run.
func TestPrimeStart(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	script := "#!/bin/sh\nprintf 'args %s\\n' \"$*\" > " + out + "\n/usr/bin/env >> " + out + "\n"
	if err := os.WriteFile(filepath.Join(dir, "env"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	t.Setenv("LANG", "C.UTF-8")
	t.Setenv(workerproto.EnvWarmToken, "claim-token")
	guarded := environGuarded
	t.Cleanup(func() { environGuarded = guarded })

	environGuarded = func() bool { return true }
	primeStart()
	if _, err := os.Stat(out); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("under Linux's kernel the prime ran (%v)", err)
	}

	environGuarded = func() bool { return false }
	primeStart()
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("under gVisor env was not run: %v", err)
	}
	got := string(b)
	if !strings.HasPrefix(got, "args true\n") || !strings.Contains(got, "\nLANG=C.UTF-8\n") {
		t.Errorf("the prime ran as\n%s\nwant `env true` with LANG", got)
	}
	if strings.Contains(got, workerproto.EnvPrefix) {
		t.Errorf("the prime's environment has Corral's variables:\n%s", got)
	}
}
