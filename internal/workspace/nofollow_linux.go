package workspace

import "syscall"

// openFlags are added to every open of a file a worker may have made: no
// symbolic link followed, and no wait for a writer if it is a FIFO (the
// open returns at once; the file is then refused as not regular).
const openFlags = syscall.O_NOFOLLOW | syscall.O_NONBLOCK
