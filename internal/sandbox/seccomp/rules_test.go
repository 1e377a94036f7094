//go:build linux

package seccomp

import (
	"math/rand/v2"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// verdict evaluates rules for in the way a runtime installing them would:
// the errno of the first rule that holds, as a filter return value, else
// allow.
func verdict(t *testing.T, rules []Rule, names map[string]uint32, in input) uint32 {
	t.Helper()
	for _, r := range rules {
		nr, ok := names[r.Name]
		if !ok {
			t.Fatalf("rule for unknown system call %q", r.Name)
		}
		if nr != in.nr {
			continue
		}
		if r.Cond == nil || uint32(in.args[r.Cond.Index])&r.Cond.Mask == r.Cond.Value {
			return unix.SECCOMP_RET_ERRNO | uint32(r.Errno)
		}
	}
	return retAllow
}

// TestRulesMatchProgram checks that Rules and Program give the same answer
// for every denied and conditional call, over edge cases and many random
// arguments (upper halves included).
func TestRulesMatchProgram(t *testing.T) {
	prog := mustProgram(t)
	rules := Rules()
	names := map[string]uint32{
		"clone3":      uint32(unix.SYS_CLONE3),
		"clone":       uint32(unix.SYS_CLONE),
		"personality": uint32(unix.SYS_PERSONALITY),
		"socket":      uint32(unix.SYS_SOCKET),
	}
	for _, s := range append(slices.Clone(denied), archDenied...) {
		names[s.name] = s.nr
	}
	for _, r := range rules {
		if r.Cond != nil && (r.Cond.Index < 0 || r.Cond.Index > 5 || r.Cond.Value&^r.Cond.Mask != 0) {
			t.Errorf("rule %+v: condition can never hold or names no argument", r)
		}
	}

	args := []uint64{0, 1, 0xffffffff, 0xfffffffe, 0x7fffffff, 0x80000000, addrNoRandomize, 0x0400000,
		uint64(unix.SIGCHLD), unix.CLONE_NEWUSER, unix.CLONE_NEWNET | unix.CLONE_VM, unix.CLONE_NEWTIME,
		unix.AF_INET, unix.AF_PACKET, unix.AF_VSOCK, 1<<32 | unix.AF_PACKET, 0xffffffff_00000000, 1 << 40}
	for bit := range 32 {
		args = append(args, 1<<bit, 0xffffffff&^(1<<bit))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		args = append(args, rng.Uint64(), rng.Uint64()&0xffffffff, uint64(rng.IntN(64)))
	}
	checked := 0
	for name, nr := range names {
		for _, a := range args {
			in := input{nr: nr, arch: auditArch, args: [6]uint64{a}}
			if got, want := verdict(t, rules, names, in), run(t, prog, in); got != want {
				t.Errorf("%s(%#x): Rules give %#x, Program %#x", name, a, got, want)
			}
			checked++
		}
	}
	t.Logf("%d rules agree with Program on %d calls", len(rules), checked)
}

func TestRulesCoverDenied(t *testing.T) {
	var unconditional []string
	for _, r := range Rules() {
		if r.Cond == nil && r.Errno == unix.EPERM {
			unconditional = append(unconditional, r.Name)
		}
	}
	if !slices.Equal(unconditional, Denied()) {
		t.Errorf("unconditional EPERM rules %v, want Denied() %v", unconditional, Denied())
	}
}
