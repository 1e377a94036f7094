//go:build linux

package docker

import (
	"encoding/json"
	"fmt"
	"slices"

	profiles "github.com/moby/profiles/seccomp"

	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/seccomp"
)

// seccompProfile is the engine's default seccomp profile (the one Docker
// ships, which allows a list of calls and refuses the rest) without the
// calls Corral refuses in every sandbox (package sandbox/seccomp: ptrace,
// io_uring, keyrings, bpf, ...). Docker's own profile allows some of those
// (ptrace on kernels from 4.8, io_uring on engines before 25), which the
// escape probe reaches. It is the JSON the engine takes as
// "seccomp=<profile>".
func seccompProfile() (string, error) {
	p := profiles.DefaultProfile()
	denied := seccomp.Denied()
	var kept []*profiles.Syscall
	for _, s := range p.Syscalls {
		s.Names = slices.DeleteFunc(s.Names, func(n string) bool {
			_, refused := slices.BinarySearch(denied, n)
			return refused
		})
		if _, refused := slices.BinarySearch(denied, s.Name); refused {
			s.Name = ""
		}
		if len(s.Names) > 0 || s.Name != "" {
			kept = append(kept, s)
		}
	}
	p.Syscalls = kept
	b, err := json.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("encode the seccomp profile: %w", err)
	}
	return string(b), nil
}

// maskedPaths are the paths the container sees empty: the /proc entries
// every sandbox has masked, and the memory of its pid 1 (docker-init, which
// runs as the sandbox's user, so the kernel would let the sandbox read and
// write it).
func maskedPaths() []string {
	out := []string{"/proc/1/mem", "/proc/1/task/1/mem", "/sys/firmware", "/sys/devices/virtual/powercap"}
	for _, n := range sandbox.ProcMasked {
		out = append(out, "/proc/"+n)
	}
	for _, n := range sandbox.ProcMaskedDirs {
		out = append(out, "/proc/"+n)
	}
	return out
}

// readonlyPaths are the /proc entries the container can read, not write.
func readonlyPaths() []string {
	var out []string
	for _, n := range sandbox.ProcReadOnly {
		out = append(out, "/proc/"+n)
	}
	return out
}
