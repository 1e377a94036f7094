//go:build linux

package seccomp

import (
	"encoding/json"
	"errors"
	"runtime"
	"slices"
	"testing"

	profiles "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// decodeProfile returns the rules of profile that name call.
func decodeProfile(t *testing.T, profile string, err error, call string) (*profiles.Seccomp, []*profiles.Syscall) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	var p profiles.Seccomp
	if err := json.Unmarshal([]byte(profile), &p); err != nil {
		t.Fatal(err)
	}
	var rules []*profiles.Syscall
	for _, s := range p.Syscalls {
		if slices.Contains(s.Names, call) || s.Name == call {
			rules = append(rules, s)
		}
	}
	return &p, rules
}

// Under runc, clone3 is refused with ENOSYS (glibc falls back to clone,
// whose flags the profile can check); for runsc, which answers every
// refusal with EPERM, clone3 is allowed and no rule asks for another
// errno. Both refuse what Corral refuses everywhere.
func TestOCIProfiles(t *testing.T) {
	runc, err := OCIProfile(runtime.GOARCH)
	_, rules := decodeProfile(t, runc, err, "clone3")
	if len(rules) != 1 || rules[0].Action != specs.ActErrno || rules[0].ErrnoRet == nil || *rules[0].ErrnoRet != uint(unix.ENOSYS) {
		t.Errorf("runc profile's clone3 rules: %+v, want one refusal with ENOSYS", rules)
	}

	gv, err := GVisorOCIProfile(runtime.GOARCH)
	p, rules := decodeProfile(t, gv, err, "clone3")
	if len(rules) != 1 || rules[0].Action != specs.ActAllow {
		t.Errorf("gVisor profile's clone3 rules: %+v, want one allow", rules)
	}
	for _, s := range p.Syscalls {
		if s.ErrnoRet != nil && *s.ErrnoRet != uint(unix.EPERM) {
			t.Errorf("gVisor profile rule %v asks for errno %d, which runsc does not return", s.Names, *s.ErrnoRet)
		}
	}
	for _, profile := range []string{runc, gv} {
		for _, call := range []string{"ptrace", "io_uring_setup", "keyctl", "bpf"} {
			if _, rules := decodeProfile(t, profile, nil, call); len(rules) != 0 {
				t.Errorf("%s is allowed: %+v", call, rules)
			}
		}
	}
}

// A profile is for the nodes' architecture, whatever the machine that
// makes it: arch_prctl, with which every amd64 program starts, is allowed
// on amd64 only, and arm's sync_file_range2 on arm64 only. Another
// architecture is refused, not given a profile that stops its programs.
func TestOCIProfileArch(t *testing.T) {
	for _, arch := range OCIArches {
		for _, gvisor := range []bool{false, true} {
			profile, err := ociProfile(arch, gvisor)
			for call, on := range map[string]string{"arch_prctl": "amd64", "sync_file_range2": "arm64"} {
				_, rules := decodeProfile(t, profile, err, call)
				if allowed := len(rules) > 0; allowed != (arch == on) {
					t.Errorf("%s profile (gvisor %v): %s allowed %v, want %v", arch, gvisor, call, allowed, arch == on)
				}
			}
		}
	}
	if _, err := OCIProfile("s390x"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a profile for s390x: %v, want an invalid argument", err)
	}
}
