//go:build linux

package seccomp

import "golang.org/x/sys/unix"

// auditArch is the architecture seccomp_data.arch reports for native
// system calls; 32-bit compat calls report AUDIT_ARCH_ARM.
const auditArch = unix.AUDIT_ARCH_AARCH64

// x32Bit is zero: arm64 has no x32-style ABI sharing its audit arch.
const x32Bit = 0

// archDenied are the denied calls not every architecture has; arm64
// never had the legacy calls amd64 refuses.
var archDenied = []syscall{
	{"kexec_file_load", unix.SYS_KEXEC_FILE_LOAD},
}
