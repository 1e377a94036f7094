//go:build linux

package gvisor

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox/seccomp"
)

// seccompArch is the OCI name of the architecture Corral was built for.
var seccompArch = map[string]string{
	"amd64": "SCMP_ARCH_X86_64",
	"arm64": "SCMP_ARCH_AARCH64",
}

// seccompProfile is the bundle's linux.seccomp: the local runtime's policy
// (seccomp.Rules), which runsc --oci-seccomp installs inside the sandbox,
// on the sentry's side of every system call the sandboxed processes make.
//
// What this runsc (20221219) does with a profile, found by running it:
//
//   - every SCMP_ACT_ERRNO returns EPERM, errnoRet is ignored. So a rule
//     that asks for another errno (clone3 with ENOSYS) is left out
//     (seccomp.RunscKeeps says why that is sound). The rule can go back
//     in once runsc honours errnoRet.
//   - a rule holds one condition per argument (a second one on the same
//     argument replaces the first), and rules for one name are
//     alternatives. seccomp.Rules has one condition per rule.
//   - SCMP_CMP_MASKED_EQ compares arg & value with valueTwo, as
//     libseccomp does.
//   - a name it does not know is skipped; the profile still loads. Every
//     name is passed, so a newer runsc refuses more.
//
// The architectures list holds the build's architecture only; gVisor
// serves no other ABI (no 32-bit calls) in any case.
func seccompProfile() (*ociSeccomp, error) {
	arch, ok := seccompArch[runtime.GOARCH]
	if !ok {
		return nil, fmt.Errorf("build seccomp profile: no seccomp architecture for %s: %w", runtime.GOARCH, errdefs.ErrNotImplemented)
	}
	p := &ociSeccomp{DefaultAction: "SCMP_ACT_ALLOW", Architectures: []string{arch}}
	var plain []string
	for _, r := range seccomp.Rules() {
		if !seccomp.RunscKeeps(r.Errno) {
			continue
		}
		if r.Cond == nil {
			plain = append(plain, r.Name)
			continue
		}
		p.Syscalls = append(p.Syscalls, ociSyscallRule{
			Names:    []string{r.Name},
			Action:   "SCMP_ACT_ERRNO",
			ErrnoRet: errnoRet(r.Errno),
			Args: []ociSeccompArg{{
				Index:    uint(r.Cond.Index),
				Value:    uint64(r.Cond.Mask),
				ValueTwo: uint64(r.Cond.Value),
				Op:       "SCMP_CMP_MASKED_EQ",
			}},
		})
	}
	p.Syscalls = append([]ociSyscallRule{{Names: plain, Action: "SCMP_ACT_ERRNO", ErrnoRet: errnoRet(unix.EPERM)}}, p.Syscalls...)
	return p, nil
}

func errnoRet(e unix.Errno) *uint {
	u := uint(e)
	return &u
}
