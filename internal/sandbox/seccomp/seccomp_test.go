//go:build linux

package seccomp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// input is a seccomp_data: what the kernel hands the filter.
type input struct {
	nr   uint32
	arch uint32
	args [6]uint64
}

func (in input) bytes() []byte {
	b := make([]byte, 64)
	binary.NativeEndian.PutUint32(b[offNr:], in.nr)
	binary.NativeEndian.PutUint32(b[offArch:], in.arch)
	for i, a := range in.args {
		binary.NativeEndian.PutUint64(b[offArgs+8*i:], a)
	}
	return b
}

// run interprets prog over in the way the kernel does for the subset of
// classic BPF the package emits, and fails on anything else, so a filter
// using an instruction this interpreter does not know cannot pass.
func run(t *testing.T, prog []Instruction, in input) uint32 {
	t.Helper()
	data := in.bytes()
	var acc uint32
	for pc := 0; pc < len(prog); pc++ {
		ins := prog[pc]
		switch ins.Code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			if ins.K%4 != 0 || int(ins.K)+4 > len(data) {
				t.Fatalf("pc %d: load at %d out of seccomp_data", pc, ins.K)
			}
			acc = binary.NativeEndian.Uint32(data[ins.K:])
		case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K:
			pc += jump(acc == ins.K, ins)
		case unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K:
			pc += jump(acc >= ins.K, ins)
		case unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K:
			pc += jump(acc&ins.K != 0, ins)
		case unix.BPF_RET | unix.BPF_K:
			return ins.K
		default:
			t.Fatalf("pc %d: unknown instruction %#x", pc, ins.Code)
		}
	}
	t.Fatalf("program ran off its end")
	return 0
}

func jump(cond bool, ins Instruction) int {
	if cond {
		return int(ins.Jt)
	}
	return int(ins.Jf)
}

func mustProgram(t *testing.T) []Instruction {
	t.Helper()
	prog, err := Program()
	if err != nil {
		t.Fatal(err)
	}
	return prog
}

func TestProgram(t *testing.T) {
	prog := mustProgram(t)
	nr := func(n uintptr, args ...uint64) input {
		in := input{nr: uint32(n), arch: auditArch}
		copy(in.args[:], args)
		return in
	}
	tests := []struct {
		name string
		in   input
		want uint32
	}{
		{"getpid", nr(unix.SYS_GETPID), retAllow},
		{"read", nr(unix.SYS_READ), retAllow},
		{"openat", nr(unix.SYS_OPENAT), retAllow},
		{"execve", nr(unix.SYS_EXECVE), retAllow},
		{"ptrace", nr(unix.SYS_PTRACE, unix.PTRACE_TRACEME), retEPERM},
		{"mount", nr(unix.SYS_MOUNT), retEPERM},
		{"unshare", nr(unix.SYS_UNSHARE, unix.CLONE_NEWUSER), retEPERM},
		{"unshare without flags", nr(unix.SYS_UNSHARE, 0), retEPERM},
		{"io_uring_setup", nr(unix.SYS_IO_URING_SETUP), retEPERM},
		{"clone3", nr(unix.SYS_CLONE3), retNoSys},
		{"fork by clone", nr(unix.SYS_CLONE, uint64(unix.SIGCHLD)), retAllow},
		{"thread by clone", nr(unix.SYS_CLONE, unix.CLONE_VM|unix.CLONE_FS|unix.CLONE_FILES|unix.CLONE_SIGHAND|unix.CLONE_THREAD|unix.CLONE_SYSVSEM), retAllow},
		{"clone CLONE_NEWUSER", nr(unix.SYS_CLONE, unix.CLONE_NEWUSER|uint64(unix.SIGCHLD)), retEPERM},
		{"clone CLONE_NEWNET", nr(unix.SYS_CLONE, unix.CLONE_NEWNET), retEPERM},
		{"clone CLONE_NEWNS", nr(unix.SYS_CLONE, unix.CLONE_NEWNS), retEPERM},
		{"clone CLONE_NEWPID in a thread", nr(unix.SYS_CLONE, unix.CLONE_VM|unix.CLONE_NEWPID), retEPERM},
		// The kernel drops clone's upper 32 flag bits; so may the filter.
		{"clone upper bits", nr(unix.SYS_CLONE, 1<<40|uint64(unix.SIGCHLD)), retAllow},
		{"personality default", nr(unix.SYS_PERSONALITY, 0), retAllow},
		{"personality query", nr(unix.SYS_PERSONALITY, 0xffffffff), retAllow},
		{"personality no ASLR", nr(unix.SYS_PERSONALITY, addrNoRandomize), retEPERM},
		{"personality READ_IMPLIES_EXEC", nr(unix.SYS_PERSONALITY, 0x0400000), retEPERM},
		{"socket inet", nr(unix.SYS_SOCKET, unix.AF_INET, unix.SOCK_STREAM), retAllow},
		{"socket unix", nr(unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_STREAM), retAllow},
		{"socket netlink", nr(unix.SYS_SOCKET, unix.AF_NETLINK, unix.SOCK_RAW), retAllow},
		{"socket packet", nr(unix.SYS_SOCKET, unix.AF_PACKET, unix.SOCK_RAW), retEPERM},
		{"socket vsock", nr(unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM), retEPERM},
		{"foreign arch", input{nr: uint32(unix.SYS_GETPID), arch: unix.AUDIT_ARCH_I386}, retKill},
		{"foreign arch, denied number", input{nr: uint32(unix.SYS_PTRACE), arch: unix.AUDIT_ARCH_ARM}, retKill},
	}
	if x32Bit != 0 {
		tests = append(tests, struct {
			name string
			in   input
			want uint32
		}{"x32 getpid", input{nr: x32Bit | uint32(unix.SYS_GETPID), arch: auditArch}, retKill})
	}
	for _, tt := range tests {
		if got := run(t, prog, tt.in); got != tt.want {
			t.Errorf("%s: filter returns %#x, want %#x", tt.name, got, tt.want)
		}
	}
	for _, s := range append(slices.Clone(denied), archDenied...) {
		if got := run(t, prog, nr(uintptr(s.nr))); got != retEPERM {
			t.Errorf("%s (%d): filter returns %#x, want EPERM", s.name, s.nr, got)
		}
	}
}

// TestEveryOtherSyscallAllowed runs every number up to well past the last
// system call: all but the denied and conditional ones are allowed.
func TestEveryOtherSyscallAllowed(t *testing.T) {
	prog := mustProgram(t)
	special := map[uint32]bool{uint32(unix.SYS_CLONE3): true}
	for _, s := range append(slices.Clone(denied), archDenied...) {
		special[s.nr] = true
	}
	allowed := 0
	for n := uint32(0); n < 1024; n++ {
		if special[n] {
			continue
		}
		in := input{nr: n, arch: auditArch}
		if n == uint32(unix.SYS_SOCKET) {
			in.args[0] = unix.AF_INET
		}
		if got := run(t, prog, in); got != retAllow {
			t.Errorf("syscall %d: filter returns %#x, want allow", n, got)
		}
		allowed++
	}
	if allowed < 900 {
		t.Errorf("only %d numbers allowed", allowed)
	}
}

func TestDenied(t *testing.T) {
	got := Denied()
	for _, want := range []string{
		"ptrace", "process_vm_readv", "process_vm_writev", "keyctl", "add_key", "request_key", "bpf",
		"perf_event_open", "io_uring_setup", "io_uring_enter", "io_uring_register", "mount", "umount2",
		"pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr",
		"unshare", "setns", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
		"reboot", "swapon", "swapoff", "acct", "open_by_handle_at", "name_to_handle_at", "userfaultfd",
		"syslog", "quotactl", "lookup_dcookie", "settimeofday", "clock_settime", "adjtimex", "vhangup", "nfsservctl",
	} {
		if !slices.Contains(got, want) {
			t.Errorf("Denied() lacks %s", want)
		}
	}
	if runtime.GOARCH == "amd64" {
		for _, want := range []string{"iopl", "ioperm", "uselib"} {
			if !slices.Contains(got, want) {
				t.Errorf("Denied() lacks %s on amd64", want)
			}
		}
	}
	if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
		t.Errorf("Denied() is not sorted and unique: %v", got)
	}
}

func TestMarshal(t *testing.T) {
	prog := mustProgram(t)
	if len(prog) > 4096 {
		t.Fatalf("program has %d instructions; the kernel takes at most 4096", len(prog))
	}
	b := Marshal(prog)
	if len(b) != InstructionSize*len(prog) || unsafe.Sizeof(Instruction{}) != InstructionSize {
		t.Fatalf("encoded %d instructions in %d bytes", len(prog), len(b))
	}
	// The encoding is the in-memory struct sock_filter array.
	raw := unsafe.Slice((*byte)(unsafe.Pointer(&prog[0])), len(b))
	if diff := cmp.Diff(raw, b); diff != "" {
		t.Errorf("Marshal differs from struct sock_filter in memory (-want +got):\n%s", diff)
	}
}

// kernelChecks are system calls the helper makes under the filter, and the
// errno each must return (0: allowed). Each is chosen so that the call
// without the filter returns something else, or succeeds harmlessly.
var kernelChecks = []struct {
	name string
	call func() error
	want error
}{
	{"getpid", func() error { _, _, e := unix.Syscall(unix.SYS_GETPID, 0, 0, 0); return errno(e) }, nil},
	// Without the filter: ESRCH (this process is not traced).
	{"ptrace", func() error {
		_, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_PEEKUSR, uintptr(os.Getpid()), 0, 0, 0, 0)
		return errno(e)
	}, unix.EPERM},
	// Without the filter: EINVAL (CLONE_NEWUSER with CLONE_FS).
	{"clone CLONE_NEWUSER", func() error {
		_, _, e := unix.RawSyscall6(unix.SYS_CLONE, unix.CLONE_NEWUSER|unix.CLONE_FS, 0, 0, 0, 0, 0)
		return errno(e)
	}, unix.EPERM},
	// Without the filter: EINVAL (a multithreaded process).
	{"unshare", func() error { return unix.Unshare(unix.CLONE_NEWUSER) }, unix.EPERM},
	// Without the filter: EINVAL (size 0).
	{"clone3", func() error { _, _, e := unix.RawSyscall(unix.SYS_CLONE3, 0, 0, 0); return errno(e) }, unix.ENOSYS},
	// Without the filter: ENOENT.
	{"umount2", func() error { return unix.Unmount("/nonexistent-corral-seccomp-test", 0) }, unix.EPERM},
	{"personality query", func() error {
		_, _, e := unix.Syscall(unix.SYS_PERSONALITY, 0xffffffff, 0, 0)
		return errno(e)
	}, nil},
	{"personality no ASLR", func() error {
		_, _, e := unix.Syscall(unix.SYS_PERSONALITY, addrNoRandomize, 0, 0)
		return errno(e)
	}, unix.EPERM},
	{"socket inet", func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}, nil},
	{"socket packet", func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}, unix.EPERM},
}

func errno(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// TestKernelEnforces loads the filter into a child process (no_new_privs
// makes that possible without privileges) and makes real system calls.
func TestKernelEnforces(t *testing.T) {
	if os.Getenv("CORRAL_SECCOMP_HELPER") == "1" {
		kernelHelper()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestKernelEnforces$")
	cmd.Env = append(os.Environ(), "CORRAL_SECCOMP_HELPER=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	got := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok && strings.HasPrefix(k, "check ") {
			got[strings.TrimPrefix(k, "check ")] = v
		}
	}
	want := map[string]string{}
	for _, c := range kernelChecks {
		want[c.name] = fmt.Sprint(c.want)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("system calls under the filter (-want +got):\n%s\nhelper output:\n%s", diff, out)
	}
}

// kernelHelper installs the filter on its own thread and reports the
// result of each check on stdout. The rest of the Go runtime's threads
// stay unfiltered; the checks run only on this one.
func kernelHelper() {
	runtime.LockOSThread()
	prog, err := Program()
	if err != nil {
		fmt.Println("program:", err)
		os.Exit(2)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fmt.Println("no_new_privs:", err)
		os.Exit(2)
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if _, _, e := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		fmt.Println("load filter:", e)
		os.Exit(2)
	}
	for _, c := range kernelChecks {
		err := c.call()
		var e unix.Errno
		if err != nil && !errors.As(err, &e) {
			fmt.Printf("check %s=unexpected %v\n", c.name, err)
			continue
		}
		fmt.Printf("check %s=%v\n", c.name, err)
	}
	os.Exit(0)
}

// addrNoRandomize is the ADDR_NO_RANDOMIZE persona flag, which turns off
// ASLR.
const addrNoRandomize = 0x0040000
