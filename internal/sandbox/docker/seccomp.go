//go:build linux

package docker

import (
	"github.com/corral-dev/corral/internal/sandbox"
)

// maskedPaths are the paths the container sees empty: the /proc entries
// every sandbox has masked, and the memory and environment of its pid 1
// (docker-init, which runs as the sandbox's user: sandbox.Pid1Masked).
func maskedPaths() []string {
	out := []string{"/sys/firmware", "/sys/devices/virtual/powercap"}
	for _, n := range sandbox.Pid1Masked {
		out = append(out, "/proc/1/"+n)
	}
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
