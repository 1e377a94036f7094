//go:build linux

package seccomp

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	profiles "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// OCIProfile is Docker's default seccomp profile (the one Docker
// ships, which allows a list of calls and refuses the rest) without the
// calls Corral refuses in every sandbox (Denied: ptrace, io_uring,
// keyrings, bpf, ...). Docker's own profile allows some of those
// (ptrace on kernels from 4.8, io_uring on engines before 25), which the
// escape probe reaches; its rules that depend on capabilities or the
// architecture are resolved for a sandbox without any capability on
// architecture arch (a GOARCH: amd64 or arm64), the nodes'. It is the JSON
// a Docker engine takes as "seccomp=<profile>", and a kubelet as a
// Localhost profile.
func OCIProfile(arch string) (string, error) { return ociProfile(arch, false) }

// GVisorOCIProfile is OCIProfile for runsc with --oci-seccomp (a gVisor
// RuntimeClass, docker under runsc), which applies a profile inside
// gVisor's kernel: Docker's profile's refusal of clone3 with ENOSYS, which
// runsc cannot keep (RunscKeeps), is an allowance here.
func GVisorOCIProfile(arch string) (string, error) { return ociProfile(arch, true) }

// OCIArches are the architectures OCIProfile makes profiles for.
var OCIArches = []string{"amd64", "arm64"}

func ociProfile(arch string, gvisor bool) (string, error) {
	// Docker's profile allows calls some architectures need under a
	// condition on the architecture (arch_prctl, which every amd64
	// program starts with, on amd64 and x32 only): resolved for another,
	// the profile stops every program.
	if !slices.Contains(OCIArches, arch) {
		return "", fmt.Errorf("no seccomp profile for architecture %q (one of %s): %w", arch, strings.Join(OCIArches, ", "), errdefs.ErrInvalidArgument)
	}
	p := profiles.DefaultProfile()
	denied := Denied()
	var kept []*profiles.Syscall
	for _, s := range p.Syscalls {
		// Corral's sandboxes hold no capability: a rule for holders of
		// one never applies, and one for those without always does. A
		// runtime that does not read these conditions (containerd's
		// Localhost profiles) would otherwise allow, say, unshare to
		// every container.
		// So are the rules for other architectures than arch:
		// containerd ignores those conditions too, and applied the s390
		// form of clone's flags rule (flags in the second argument) on
		// amd64, which let any clone through.
		if s.Includes != nil && (len(s.Includes.Caps) > 0 || len(s.Includes.Arches) > 0 && !slices.Contains(s.Includes.Arches, arch)) {
			continue
		}
		if s.Excludes != nil && slices.Contains(s.Excludes.Arches, arch) {
			continue
		}
		if s.Includes != nil {
			s.Includes.Arches = nil
		}
		if s.Excludes != nil {
			s.Excludes.Caps, s.Excludes.Arches = nil, nil
		}
		s.Names = slices.DeleteFunc(s.Names, func(n string) bool {
			_, refused := slices.BinarySearch(denied, n)
			return refused
		})
		if _, refused := slices.BinarySearch(denied, s.Name); refused {
			s.Name = ""
		}
		if gvisor && s.ErrnoRet != nil && !RunscKeeps(unix.Errno(*s.ErrnoRet)) {
			if *s.ErrnoRet != uint(unix.ENOSYS) {
				return "", fmt.Errorf("the seccomp profile refuses %v with errno %d, which runsc cannot return", s.Names, *s.ErrnoRet)
			}
			s.Action, s.ErrnoRet, s.Excludes = specs.ActAllow, nil, nil
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
