package hostuser

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
	"golang.org/x/sys/unix"
)

// Pin holds every host directory of spec (Mount.HostDir: a workspace
// under an operator's root, whose owner may rename, swap or replace it at
// any moment) as it is now: opened once, without following a link at its
// last component, and bound at a directory of the server's under pins,
// which the returned spec names in its place. A runtime then binds what
// was checked, whatever happens to the path meanwhile, and Give and
// Reclaim walk the same directory; Unpin(pins) undoes it. A directory the
// sandbox identity id owns already is held by another sandbox (or left
// by a server that died, until its restart takes it back), as is one any
// sandbox identity of the range owns, and refused.
//
// pins must be a directory only the server writes, on a path the
// sandbox identity may pass through (a runtime launching as that
// identity binds it by path); Pin makes it 0711.
func Pin(spec sandbox.Spec, pins string, id Identity) (sandbox.Spec, error) {
	spec.Mounts = slices.Clone(spec.Mounts)
	for i, m := range spec.Mounts {
		if !m.HostDir {
			continue
		}
		p, err := pin(m.Source, filepath.Join(pins, strconv.Itoa(i)), pins, id)
		if err != nil {
			return spec, errors.Join(err, Unpin(pins))
		}
		spec.Mounts[i].Source = p
	}
	return spec, nil
}

func pin(src, at, pins string, id Identity) (string, error) {
	fd, err := unix.Open(src, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP):
		return "", fmt.Errorf("workspace %s is no longer a directory (a link or a file took its place): %w", src, errdefs.ErrPermissionDenied)
	case err != nil:
		return "", fmt.Errorf("pin workspace %s: %w", src, err)
	}
	defer unix.Close(fd)
	var held unix.Stat_t
	if err := unix.Fstat(fd, &held); err != nil {
		return "", fmt.Errorf("pin workspace %s: %w", src, err)
	}
	if id.Switch() && (int(held.Uid) == id.UID || InRange(int(held.Uid))) {
		return "", fmt.Errorf("workspace %s is held by another sandbox (its owner is uid %d, a sandbox identity; this sandbox's is %s): %w", src, held.Uid, id, errdefs.ErrConflict)
	}
	if err := os.MkdirAll(pins, 0o711); err != nil {
		return "", fmt.Errorf("pin workspace %s: %w", src, err)
	}
	if err := os.Chmod(pins, 0o711); err != nil {
		return "", fmt.Errorf("pin workspace %s: %w", src, err)
	}
	if err := os.Mkdir(at, 0o700); err != nil {
		return "", fmt.Errorf("pin workspace %s: %w", src, err)
	}
	// The /proc/self/fd link names the directory held, not a path: the
	// mount binds exactly that.
	if err := unix.Mount("/proc/self/fd/"+strconv.Itoa(fd), at, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return "", fmt.Errorf("pin workspace %s: bind it at %s: %w", src, at, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(at, &st); err != nil || st.Dev != held.Dev || st.Ino != held.Ino {
		return "", fmt.Errorf("pin workspace %s: %s is not the directory held: %w", src, at, errors.Join(err, errReplaced))
	}
	return at, nil
}

// Unpin removes what Pin made under pins: each bind is detached and its
// mount point removed, then pins itself. A mount point that cannot be
// removed (still mounted, or not empty) is an error, and nothing under it
// is touched: a caller must not remove a directory holding a pin, which
// would remove the workspace's files. A missing pins is no error.
func Unpin(pins string) error {
	ents, err := os.ReadDir(pins)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("unpin %s: %w", pins, err)
	}
	var errs []error
	for _, e := range ents {
		p := filepath.Join(pins, e.Name())
		err := unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		if err != nil && !errors.Is(err, unix.EINVAL) { // EINVAL: not a mount point (any more)
			errs = append(errs, fmt.Errorf("unpin %s: %w", p, err))
			continue
		}
		if err := unix.Rmdir(p); err != nil {
			errs = append(errs, fmt.Errorf("unpin %s: %w", p, err))
		}
	}
	if len(errs) == 0 {
		if err := unix.Rmdir(pins); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unpin %s: %w", pins, err))
		}
	}
	return errors.Join(errs...)
}
