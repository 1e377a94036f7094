//go:build linux

package seccomp

import (
	"slices"

	"golang.org/x/sys/unix"
)

// Rule is one refusal of the filter in a structured form, for runtimes
// that install a filter of their own from a description (gVisor reads the
// linux.seccomp section of an OCI bundle) rather than from Program.
//
// The system call Name fails with Errno, always if Cond is nil, else when
// Cond holds. Several rules for one name are alternatives: the call fails
// if any of them holds. Every call no rule refuses is allowed.
type Rule struct {
	Name  string
	Errno unix.Errno
	Cond  *Cond
}

// Cond is a condition on one argument of a system call: the low 32 bits of
// argument Index, masked with Mask, equal Value. Only the low 32 bits are
// compared because the kernel reads the arguments the filter checks (clone
// flags, a persona, a socket family) as 32-bit values whatever the upper
// half of the register holds.
type Cond struct {
	Index int
	Mask  uint32
	Value uint32
}

// RunscKeeps reports whether runsc with --oci-seccomp keeps the meaning of
// a refusal with errno e. It does not for any but EPERM: runsc (Debian's
// 20221219 and builds of gVisor's 2025 sources alike, found by running
// them) answers EPERM for every refusal of a profile, whatever errnoRet
// asks. The one refusal that asks for another is clone3's ENOSYS, on
// which C libraries fall back to clone; refused with EPERM instead, no C
// program could start a thread (the Go runtime's pthread_create fails,
// Claude Code's runtime dies at once). So a profile for runsc allows such
// a call instead of refusing it. Allowed there, clone3 is gVisor's
// kernel's: Debian's runsc has none (ENOSYS), and under one that has, the
// namespace flags it takes, which no filter can read (they are in
// memory), make namespaces of gVisor's kernel, never the host's.
func RunscKeeps(e unix.Errno) bool { return e == unix.EPERM }

// Rules returns the policy Program enforces as Rules, for the architecture
// Corral was built for: the Denied calls with EPERM, clone3 with ENOSYS,
// clone with any namespace flag, personality with anything but the
// default persona or the query, and socket with a refused family, each
// with EPERM. Program's check of the ABI (calls from another ABI kill the
// process) has no Rule: a runtime states the architecture in its own
// terms.
//
// Conditions are masked equalities because that is what OCI seccomp
// profiles and libseccomp express; where Program tests a range (the
// persona) the Rules spell it out as several alternatives with the same
// outcome.
func Rules() []Rule {
	var out []Rule
	for _, name := range Denied() {
		out = append(out, Rule{Name: name, Errno: unix.EPERM})
	}
	out = append(out, Rule{Name: "clone3", Errno: unix.ENOSYS})
	// clone: one rule per namespace flag, each true when that bit is set.
	for bit := uint32(1); bit != 0; bit <<= 1 {
		if cloneNewFlags&bit != 0 {
			out = append(out, Rule{Name: "clone", Errno: unix.EPERM, Cond: &Cond{Index: 0, Mask: bit, Value: bit}})
		}
	}
	// personality: refused unless the persona is 0 (all bits clear) or
	// the query 0xffffffff (all bits set). A value that is neither has,
	// going round its 32 bits, some set bit followed by a clear one, and
	// those two values have none: one rule per pair of neighbouring bits.
	for i := range 32 {
		lo, hi := uint32(1)<<i, uint32(1)<<((i+1)%32)
		out = append(out, Rule{Name: "personality", Errno: unix.EPERM, Cond: &Cond{Index: 0, Mask: lo | hi, Value: lo}})
	}
	for _, fam := range slices.Sorted(slices.Values(deniedFamilies)) {
		out = append(out, Rule{Name: "socket", Errno: unix.EPERM, Cond: &Cond{Index: 0, Mask: 0xffffffff, Value: fam}})
	}
	return out
}
