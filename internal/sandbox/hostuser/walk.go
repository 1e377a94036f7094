package hostuser

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// A tree is walked by file descriptor, never by path: each directory is
// opened relative to its parent's descriptor with O_NOFOLLOW|O_DIRECTORY
// and every change is made on a descriptor or on a name relative to one,
// so no component of any path is ever resolved again, a link swapped in
// anywhere is met as a link and not followed, and no path is long enough
// to hit PATH_MAX.
//
// Descriptors are held for the directories on the way down to
// keepOpen deep; below that a directory's parent is closed while its
// entries are walked and opened again through "..", then checked to be
// the same directory (device and inode), so a tree of any depth needs at
// most keepOpen+2 descriptors.
const keepOpen = 64

// visitor is what a walk does to the entries of a tree.
type visitor struct {
	// enter is called for each directory, open at fd, before its entries.
	enter func(fd int, st *unix.Stat_t) error
	// leave is called for each directory after its entries.
	leave func(fd int, st *unix.Stat_t) error
	// entry is called for each entry that is not a directory, name in
	// the directory open at dirfd.
	entry func(dirfd int, name string, st *unix.Stat_t) error
}

// frame is a directory on the walk's way down.
type frame struct {
	fd    int // -1 while closed for a deeper directory
	st    unix.Stat_t
	names []string // entries still to visit
	path  string   // for errors only
}

// maxErrors is how many of a walk's failed entries its error names.
const maxErrors = 10

// walkTree walks the tree of the directory open at top (which it neither
// closes nor needs afterwards), depth first. An error at one entry is
// recorded and the walk goes on with the next; an error that leaves the
// walk without a way back up (a parent not found again through "..")
// ends it. It returns every error, joined.
func walkTree(top int, path string, v visitor) error {
	var errs []error
	failed := 0
	fail := func(p string, err error) {
		if failed++; failed <= maxErrors {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
		}
	}
	result := func() error {
		if failed > maxErrors {
			errs = append(errs, fmt.Errorf("and %d more entries", failed-maxErrors))
		}
		return errors.Join(errs...)
	}
	var st unix.Stat_t
	if err := unix.Fstat(top, &st); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	stack := []frame{}
	push := func(fd int, st *unix.Stat_t, p string) {
		if err := v.enter(fd, st); err != nil {
			fail(p, err)
		}
		names, err := readNames(fd)
		if err != nil {
			fail(p, err)
		}
		stack = append(stack, frame{fd: fd, st: *st, names: names, path: p})
	}
	push(top, &st, path)
	for len(stack) > 0 {
		f := &stack[len(stack)-1]
		if len(f.names) == 0 {
			if err := v.leave(f.fd, &f.st); err != nil {
				fail(f.path, err)
			}
			stack = stack[:len(stack)-1]
			if len(stack) > 0 {
				if err := reopenParent(&stack[len(stack)-1], f.fd); err != nil {
					unix.Close(f.fd)
					closeAll(stack)
					errs = append(errs, err)
					return result()
				}
			}
			if f.fd != top {
				unix.Close(f.fd)
			}
			continue
		}
		name := f.names[0]
		f.names = f.names[1:]
		p := f.path + "/" + name
		var est unix.Stat_t
		if err := unix.Fstatat(f.fd, name, &est, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if !errors.Is(err, unix.ENOENT) {
				fail(p, err)
			}
			continue
		}
		if est.Mode&unix.S_IFMT != unix.S_IFDIR {
			if err := v.entry(f.fd, name, &est); err != nil {
				fail(p, err)
			}
			continue
		}
		fd, err := unix.Openat(f.fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			fail(p, err)
			continue
		}
		var dst unix.Stat_t
		if err := unix.Fstat(fd, &dst); err != nil || dst.Dev != est.Dev || dst.Ino != est.Ino {
			unix.Close(fd)
			fail(p, fmt.Errorf("replaced while being walked: %w", errors.Join(err, errReplaced)))
			continue
		}
		if len(stack) >= keepOpen && f.fd != top {
			unix.Close(f.fd)
			f.fd = -1
		}
		push(fd, &dst, p)
	}
	return result()
}

// errReplaced is a directory that is not the one the walk saw a moment
// before.
var errReplaced = errors.New("a directory of the tree was replaced")

// reopenParent opens parent again through "..", from child, when the walk
// closed it, and checks it is the same directory.
func reopenParent(parent *frame, child int) error {
	if parent.fd >= 0 {
		return nil
	}
	fd, err := unix.Openat(child, "..", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: open again: %w", parent.path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Dev != parent.st.Dev || st.Ino != parent.st.Ino {
		unix.Close(fd)
		return fmt.Errorf("%s: %w", parent.path, errors.Join(err, errReplaced))
	}
	parent.fd = fd
	return nil
}

// closeAll closes the descriptors the walk holds, all but the top's.
func closeAll(stack []frame) {
	for i, f := range stack {
		if i > 0 && f.fd >= 0 {
			unix.Close(f.fd)
		}
	}
}

// readNames lists the directory open at fd, all of it, before anything
// in it changes.
func readNames(fd int) ([]string, error) {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "dir")
	defer f.Close()
	if _, err := unix.Seek(dup, 0, 0); err != nil {
		return nil, err
	}
	return f.Readdirnames(-1)
}

// openDir opens dir, refusing a link at its last component; the
// components before it are the operator's (the data root, a workspace
// root) and are resolved as usual.
func openDir(dir string) (int, error) {
	return unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

// chmodHeld sets the mode of the file open at an O_PATH descriptor,
// through its /proc/self/fd link, which names the open file itself.
func chmodHeld(fd int, mode uint32) error {
	return unix.Fchmodat(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), mode, 0)
}
