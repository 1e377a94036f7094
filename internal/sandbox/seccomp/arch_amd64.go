//go:build linux

package seccomp

import "golang.org/x/sys/unix"

// auditArch is the architecture seccomp_data.arch reports for native
// system calls; i386 calls (int 0x80) report AUDIT_ARCH_I386.
const auditArch = unix.AUDIT_ARCH_X86_64

// x32Bit marks a system call of the x32 ABI (__X32_SYSCALL_BIT).
const x32Bit = 0x40000000

// archDenied are the denied calls not every architecture has: raw I/O
// ports, legacy calls and kexec_file_load.
var archDenied = []syscall{
	{"kexec_file_load", unix.SYS_KEXEC_FILE_LOAD},
	{"iopl", unix.SYS_IOPL},
	{"ioperm", unix.SYS_IOPERM},
	{"uselib", unix.SYS_USELIB},
	{"create_module", unix.SYS_CREATE_MODULE},
	{"get_kernel_syms", unix.SYS_GET_KERNEL_SYMS},
	{"query_module", unix.SYS_QUERY_MODULE},
	{"_sysctl", unix.SYS__SYSCTL},
	{"ustat", unix.SYS_USTAT},
	{"sysfs", unix.SYS_SYSFS},
}
