//go:build linux

// Package seccomp builds the seccomp filter every local sandbox runs under:
// a classic BPF program, assembled here in pure Go (no libseccomp, no cgo),
// that the kernel runs on every system call a sandboxed process makes.
//
// The filter is a deny list on top of the sandbox's other walls (user, pid,
// mount and network namespaces, no capabilities, no_new_privs). It follows
// the intent of Docker's default profile: system calls that reach kernel
// subsystems a coding agent never needs, and that have a history of
// privilege escalation bugs, fail with EPERM. It
//
//   - kills the process if the system call comes from another ABI than the
//     one Corral was built for (i386 on amd64, the x32 ABI, arm32 compat on
//     arm64), because syscall numbers differ between ABIs;
//   - refuses tracing and other processes' memory (ptrace,
//     process_vm_readv/writev, kcmp, pidfd_getfd, process_madvise), the
//     kernel keyring, bpf, perf_event_open, io_uring, userfaultfd,
//     fanotify;
//   - refuses every way to change the mount table or enter or create a
//     namespace (mount, umount2, pivot_root, the new mount API, unshare,
//     setns, clone with a CLONE_NEW* flag), and makes clone3 fail with
//     ENOSYS, because a filter cannot read clone3's flags (they sit in
//     memory): libc and Go then fall back to clone, whose flags it checks;
//   - refuses kernel modules, kexec, reboot, swap, accounting, quotas,
//     the kernel log, file handles (open_by_handle_at, the "shocker"
//     escape), setting the clock, raw I/O ports, and legacy calls;
//   - allows personality only for the default persona and the query, so
//     ASLR cannot be turned off;
//   - refuses AF_PACKET and AF_VSOCK sockets.
//
// What it does not do: it is not an allow list, so a system call added to
// the kernel after this list was written is allowed (Docker's profile errs
// the other way). Calls that need a capability the sandbox never holds
// (chroot, mknod, sethostname, raw IP sockets) are left to the capability
// checks. Memory policy calls (mbind, set_mempolicy, move_pages) that
// Docker refuses without CAP_SYS_NICE stay allowed: they only place the
// caller's own memory, and some runtimes (Java, Node) probe them.
package seccomp

import (
	"encoding/binary"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Instruction is one classic BPF instruction, laid out as the kernel's
// struct sock_filter.
type Instruction = unix.SockFilter

// InstructionSize is the size of one encoded Instruction in bytes.
const InstructionSize = 8

// Offsets into struct seccomp_data, the input of a seccomp filter: the
// system call number (int32), the audit architecture (uint32), the
// instruction pointer (uint64), then six uint64 arguments. Both supported
// architectures are little-endian, so an argument's low 32 bits come
// first.
const (
	offNr   = 0
	offArch = 4
	offArgs = 16
)

// argLow is the offset of the low 32 bits of argument i.
func argLow(i int) uint32 { return offArgs + 8*uint32(i) }

// Return values of the filter.
const (
	retAllow = unix.SECCOMP_RET_ALLOW
	retKill  = unix.SECCOMP_RET_KILL_PROCESS
	retEPERM = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retNoSys = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
)

// cloneNewFlags are the clone flags that create a namespace. CLONE_NEWTIME
// is not among them: its bit is part of the exit signal for clone and it is
// only valid for clone3 and unshare, both refused outright.
const cloneNewFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// Personas personality accepts: the default (PER_LINUX) and 0xffffffff,
// which only queries the current persona.
const (
	perLinux     = 0
	personaQuery = 0xffffffff
)

// Socket families the filter refuses: packet sockets see every frame of an
// interface, and vsock reaches the hypervisor or the host of a VM.
var deniedFamilies = []uint32{unix.AF_PACKET, unix.AF_VSOCK}

// syscall is a system call by name and number on this architecture.
type syscall struct {
	name string
	nr   uint32
}

// denied are the system calls refused with EPERM on every architecture;
// archDenied (per GOARCH) adds the ones only that architecture has.
var denied = []syscall{
	// Tracing and other processes' memory.
	{"ptrace", unix.SYS_PTRACE},
	{"process_vm_readv", unix.SYS_PROCESS_VM_READV},
	{"process_vm_writev", unix.SYS_PROCESS_VM_WRITEV},
	{"kcmp", unix.SYS_KCMP},
	{"pidfd_getfd", unix.SYS_PIDFD_GETFD},
	{"process_madvise", unix.SYS_PROCESS_MADVISE},
	// Kernel subsystems with a long record of escalation bugs.
	{"keyctl", unix.SYS_KEYCTL},
	{"add_key", unix.SYS_ADD_KEY},
	{"request_key", unix.SYS_REQUEST_KEY},
	{"bpf", unix.SYS_BPF},
	{"perf_event_open", unix.SYS_PERF_EVENT_OPEN},
	{"io_uring_setup", unix.SYS_IO_URING_SETUP},
	{"io_uring_enter", unix.SYS_IO_URING_ENTER},
	{"io_uring_register", unix.SYS_IO_URING_REGISTER},
	{"userfaultfd", unix.SYS_USERFAULTFD},
	{"fanotify_init", unix.SYS_FANOTIFY_INIT},
	// The mount table and namespaces.
	{"mount", unix.SYS_MOUNT},
	{"umount2", unix.SYS_UMOUNT2},
	{"pivot_root", unix.SYS_PIVOT_ROOT},
	{"move_mount", unix.SYS_MOVE_MOUNT},
	{"open_tree", unix.SYS_OPEN_TREE},
	{"fsopen", unix.SYS_FSOPEN},
	{"fsconfig", unix.SYS_FSCONFIG},
	{"fsmount", unix.SYS_FSMOUNT},
	{"fspick", unix.SYS_FSPICK},
	{"mount_setattr", unix.SYS_MOUNT_SETATTR},
	{"unshare", unix.SYS_UNSHARE},
	{"setns", unix.SYS_SETNS},
	// The machine: modules, kexec, power, swap, accounting, quotas.
	{"init_module", unix.SYS_INIT_MODULE},
	{"finit_module", unix.SYS_FINIT_MODULE},
	{"delete_module", unix.SYS_DELETE_MODULE},
	{"kexec_load", unix.SYS_KEXEC_LOAD},
	{"reboot", unix.SYS_REBOOT},
	{"swapon", unix.SYS_SWAPON},
	{"swapoff", unix.SYS_SWAPOFF},
	{"acct", unix.SYS_ACCT},
	{"quotactl", unix.SYS_QUOTACTL},
	{"quotactl_fd", unix.SYS_QUOTACTL_FD},
	{"syslog", unix.SYS_SYSLOG},
	{"vhangup", unix.SYS_VHANGUP},
	{"lookup_dcookie", unix.SYS_LOOKUP_DCOOKIE},
	{"nfsservctl", unix.SYS_NFSSERVCTL},
	// File handles bypass path permissions (the "shocker" escape).
	{"open_by_handle_at", unix.SYS_OPEN_BY_HANDLE_AT},
	{"name_to_handle_at", unix.SYS_NAME_TO_HANDLE_AT},
	// The clock.
	{"settimeofday", unix.SYS_SETTIMEOFDAY},
	{"clock_settime", unix.SYS_CLOCK_SETTIME},
	{"clock_adjtime", unix.SYS_CLOCK_ADJTIME},
	{"adjtimex", unix.SYS_ADJTIMEX},
}

// Denied returns the names of the system calls the filter refuses outright
// on this architecture, sorted. clone3 (ENOSYS), clone with namespace
// flags, personality other than the default and socket families are
// conditional and not in the list.
func Denied() []string {
	var out []string
	for _, s := range append(slices.Clone(denied), archDenied...) {
		out = append(out, s.name)
	}
	slices.Sort(out)
	return out
}

// Program returns the filter for the architecture Corral was built for. It
// wraps errdefs.ErrNotImplemented on an architecture it has no syscall
// table for (anything but amd64 and arm64).
func Program() ([]Instruction, error) {
	if auditArch == 0 {
		return nil, fmt.Errorf("build seccomp filter: no syscall table for this architecture: %w", errdefs.ErrNotImplemented)
	}
	var p prog
	// The architecture first: syscall numbers mean different calls in
	// another ABI, so a foreign one is killed before any number is read.
	p.load(offArch)
	p.jeq(auditArch, 1, 0)
	p.ret(retKill)
	p.load(offNr)
	if x32Bit != 0 {
		// The x32 ABI shares AUDIT_ARCH_X86_64 and sets this bit in
		// the number.
		p.jge(x32Bit, 0, 1)
		p.ret(retKill)
	}
	for _, s := range append(slices.Clone(denied), archDenied...) {
		p.jeq(s.nr, 0, 1)
		p.ret(retEPERM)
	}
	p.jeq(unix.SYS_CLONE3, 0, 1)
	p.ret(retNoSys)

	// The conditional calls. Each block loads an argument, so each ends
	// in a return; the accumulator no longer holds the number after it.
	//
	// clone(flags, ...): the flags are argument 0 on both architectures,
	// and the kernel uses only their low 32 bits.
	p.jeq(unix.SYS_CLONE, 0, 4)
	p.load(argLow(0))
	p.jset(cloneNewFlags, 0, 1)
	p.ret(retEPERM)
	p.ret(retAllow)
	// personality(persona): an unsigned int.
	p.jeq(unix.SYS_PERSONALITY, 0, 5)
	p.load(argLow(0))
	p.jeq(perLinux, 2, 0)
	p.jeq(personaQuery, 1, 0)
	p.ret(retEPERM)
	p.ret(retAllow)
	// socket(domain, type, protocol).
	n := uint8(len(deniedFamilies))
	p.jeq(unix.SYS_SOCKET, 0, 2+n+1)
	p.load(argLow(0))
	for i, fam := range deniedFamilies {
		p.jeq(fam, n-uint8(i), 0)
	}
	p.ret(retAllow)
	p.ret(retEPERM)

	p.ret(retAllow)
	return p.insns, nil
}

// Marshal encodes prog as the kernel's array of struct sock_filter in the
// machine's byte order: the byte stream bwrap's --seccomp FD reads.
func Marshal(prog []Instruction) []byte {
	b := make([]byte, 0, len(prog)*InstructionSize)
	for _, in := range prog {
		b = binary.NativeEndian.AppendUint16(b, in.Code)
		b = append(b, in.Jt, in.Jf)
		b = binary.NativeEndian.AppendUint32(b, in.K)
	}
	return b
}

// prog assembles a program. Jump offsets count instructions after the
// jump, as in classic BPF (0 is the next instruction).
type prog struct{ insns []Instruction }

func (p *prog) add(code uint16, jt, jf uint8, k uint32) {
	p.insns = append(p.insns, Instruction{Code: code, Jt: jt, Jf: jf, K: k})
}

// load loads the 32-bit word at off of seccomp_data into the accumulator.
func (p *prog) load(off uint32) { p.add(unix.BPF_LD|unix.BPF_W|unix.BPF_ABS, 0, 0, off) }

// jeq jumps jt forward if the accumulator equals k, else jf.
func (p *prog) jeq(k uint32, jt, jf uint8) { p.add(unix.BPF_JMP|unix.BPF_JEQ|unix.BPF_K, jt, jf, k) }

// jge jumps jt forward if the accumulator is at least k, else jf.
func (p *prog) jge(k uint32, jt, jf uint8) { p.add(unix.BPF_JMP|unix.BPF_JGE|unix.BPF_K, jt, jf, k) }

// jset jumps jt forward if the accumulator has any bit of k set, else jf.
func (p *prog) jset(k uint32, jt, jf uint8) { p.add(unix.BPF_JMP|unix.BPF_JSET|unix.BPF_K, jt, jf, k) }

// ret ends the program with verdict v.
func (p *prog) ret(v uint32) { p.add(unix.BPF_RET|unix.BPF_K, 0, 0, v) }
