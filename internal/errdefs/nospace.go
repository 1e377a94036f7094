package errdefs

import "fmt"

// ErrNoSpace is the ErrResourceExhausted of a full disk: the data root
// below its free-space floor, or a write the filesystem refused (ENOSPC,
// SQLite's "database or disk is full"). Transports answer it with 507.
var ErrNoSpace = fmt.Errorf("no space left on the server's disk: %w", ErrResourceExhausted)
