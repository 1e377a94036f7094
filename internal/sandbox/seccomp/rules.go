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
