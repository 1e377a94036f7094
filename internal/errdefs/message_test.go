package errdefs_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

// errPathEscapes is a package sentinel that wraps a class, as
// workspace.ErrPathEscapes does.
var errPathEscapes = fmt.Errorf("path escapes workspace: %w", errdefs.ErrPermissionDenied)

func TestMessage(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("give the task description: %w", errdefs.ErrInvalidArgument), "give the task description"},
		{fmt.Errorf("path %q contains \"..\": %w", "../x", errPathEscapes), `path "../x" contains "..": path escapes workspace`},
		{fmt.Errorf("request body is over the limit of 10 bytes: %w", errdefs.ErrTooLarge), "request body is over the limit of 10 bytes: too large"},
		// What os.Root reports, classified as workspace does it.
		{fmt.Errorf("%w: %w", &fs.PathError{Op: "openat", Path: "notes/a.txt", Err: syscall.ENOENT}, errdefs.ErrNotFound), "notes/a.txt: no such file or directory"},
		{&errdefs.FieldError{Field: "path", Err: fmt.Errorf("%w: %w", &fs.PathError{Op: "statat", Path: "a/b.txt/c", Err: syscall.ENOTDIR}, errdefs.ErrFailedPrecondition)}, "path: a/b.txt/c: not a directory"},
		{fmt.Errorf("save: %w", &os.LinkError{Op: "renameat2", Old: ".corral-tmp-1", New: "a.txt", Err: syscall.EXDEV}), "save: .corral-tmp-1 -> a.txt: invalid cross-device link"},
		// A host path is left out, with the system call's name.
		{fmt.Errorf("write output: %w", &fs.PathError{Op: "openat", Path: "/var/lib/corral/tasks/t/output/x", Err: syscall.ENOSPC}), "write output: no space left on device"},
		{fmt.Errorf("move: %w", &os.LinkError{Op: "renameat2", Old: "/srv/data/a", New: "b", Err: syscall.EACCES}), "move: permission denied"},
		{fmt.Errorf("reach the proxy: %w", os.NewSyscallError("connect", syscall.ECONNREFUSED)), "reach the proxy: connection refused"},
		// "not found" stays where it is the only word that says so.
		{fmt.Errorf("task %s: %w", "task-1", errdefs.ErrNotFound), "task task-1: not found"},
		{fmt.Errorf("no skill %q: %w", "x", errdefs.ErrNotFound), `no skill "x"`},
		{&errdefs.FieldError{Field: "after", Err: fmt.Errorf("no event %q: %w", "e", errdefs.ErrNotFound)}, `after: no event "e"`},
		{errors.Join(errdefs.Field("a", "is required"), &errdefs.FieldError{Field: "b", Err: fmt.Errorf("must be positive: %w", errdefs.ErrInvalidArgument)}), "a: is required\nb: must be positive"},
		{fmt.Errorf("%w (setting quotas needs root)", fmt.Errorf("set quota: %w", errdefs.ErrPermissionDenied)), "set quota (setting quotas needs root)"},
		{fmt.Errorf("runsc %s: %w: %s", "run", errors.New("exit status 1"), "boom"), "runsc run: exit status 1: boom"},
		{errdefs.ErrUnavailable, "unavailable"},
		{errors.New("plain"), "plain"},
	} {
		if got := errdefs.Message(c.err); got != c.want {
			t.Errorf("Message(%q) = %q, want %q", c.err.Error(), got, c.want)
		}
	}
}
