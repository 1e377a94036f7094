//go:build linux && !amd64 && !arm64

package seccomp

// auditArch is zero: Program has no syscall table for this architecture.
const auditArch = 0

const x32Bit = 0

var archDenied []syscall
