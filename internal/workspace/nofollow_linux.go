package workspace

import "syscall"

const noFollow = syscall.O_NOFOLLOW
