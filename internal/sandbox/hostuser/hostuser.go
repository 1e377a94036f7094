// Package hostuser is the host identity the host runtimes (sandbox/local,
// sandbox/gvisor) run sandboxes as, and the hand-over of a sandbox's
// read-write directories to it and back.
//
// A sandbox's processes never run as host root. A server running as root
// runs every sandbox as one reserved, unprivileged host identity (Default:
// uid and gid 1900000000, far above the ranges given to people, to system
// users and to subordinate id ranges); a server running as another user
// runs them as that user, the only identity it has. Whatever uid a process
// sees inside, the kernel checks its access on the host as this identity:
// it cannot write the host's /proc/sys, read root-only files, or signal the
// host's processes.
//
// Give hands a sandbox's read-write directories to the identity before it
// starts; Reclaim takes them back once it is gone: owned by whoever owned
// each directory before (the server for its data root, the owner of a
// workspace under an operator's root) again, with no set-uid, set-gid or
// sticky bit and no group or other write permission left, so nothing a
// worker wrote carries mode bits or ownership the host would honour.
package hostuser

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
	"golang.org/x/sys/unix"
)

// Reserved is the default host uid and gid of sandboxes under a root server.
const Reserved = 1900000000

// Identity is a host uid and gid.
type Identity struct {
	UID, GID int
}

// String is "uid:gid".
func (id Identity) String() string { return strconv.Itoa(id.UID) + ":" + strconv.Itoa(id.GID) }

// Default is the identity sandboxes run as: Reserved under a root server,
// else the server's own.
func Default() Identity {
	if os.Geteuid() == 0 {
		return Identity{UID: Reserved, GID: Reserved}
	}
	return Identity{UID: os.Geteuid(), GID: os.Getegid()}
}

// Switch reports whether running as id needs a change of identity (the
// server runs as root; id is another identity).
func (id Identity) Switch() bool { return os.Geteuid() == 0 && id.UID != 0 }

// Credential is id for SysProcAttr.Credential: a process started with it
// runs as id with no supplementary groups, and, as a uid change from root
// clears them, no capabilities.
func (id Identity) Credential() *syscall.Credential {
	return &syscall.Credential{Uid: uint32(id.UID), Gid: uint32(id.GID), Groups: []uint32{}}
}

// Validate refuses an identity a sandbox must never have: host root, and,
// under a root server, an id in a range the host gives to people: their
// accounts (login.defs' UID_MIN..UID_MAX, GID_MIN..GID_MAX; 1000..60000
// when the file does not say) and their subordinate ids for containers
// (SUB_UID_MIN..SUB_UID_MAX, ...; 100000..600100000). loginDefs is the path of login.defs ("" for
// /etc/login.defs).
func (id Identity) Validate(loginDefs string) error {
	if id.UID < 0 || id.GID < 0 || id.UID > 1<<32-2 || id.GID > 1<<32-2 {
		return fmt.Errorf("sandbox host identity %s: ids are 0 to 4294967294", id)
	}
	if id.UID == 0 || id.GID == 0 {
		return fmt.Errorf("sandbox host identity %s: sandboxes never run as host root (uid or gid 0)", id)
	}
	if os.Geteuid() != 0 {
		return nil
	}
	r := readRanges(loginDefs)
	for _, c := range []struct {
		kind string
		id   int
	}{{"UID", id.UID}, {"GID", id.GID}} {
		for _, rng := range []string{"", "SUB_"} {
			lo, hi := r[rng+c.kind+"_MIN"], r[rng+c.kind+"_MAX"]
			if c.id >= lo && c.id <= hi {
				return fmt.Errorf("sandbox host identity %s: %s %d is in the range login.defs gives to people (%s%s_MIN-%s%s_MAX, %d-%d); use an id no person owns, e.g. %d",
					id, strings.ToLower(c.kind), c.id, rng, c.kind, rng, c.kind, lo, hi, Reserved)
			}
		}
	}
	return nil
}

// readRanges reads the ranges of people's ids (UID_MIN, UID_MAX, GID_MIN,
// GID_MAX) and of their subordinate ids (SUB_UID_MIN, ...) from
// login.defs, with Debian's defaults for what it lacks.
func readRanges(path string) map[string]int {
	r := map[string]int{"UID_MIN": 1000, "UID_MAX": 60000, "GID_MIN": 1000, "GID_MAX": 60000,
		"SUB_UID_MIN": 100000, "SUB_UID_MAX": 600100000, "SUB_GID_MIN": 100000, "SUB_GID_MAX": 600100000}
	if path == "" {
		path = "/etc/login.defs"
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return r
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if _, ok := r[f[0]]; ok {
			if n, err := strconv.Atoi(f[1]); err == nil {
				r[f[0]] = n
			}
		}
	}
	return r
}

// WritableDirs are the sources of the read-write directory mounts among
// mounts (a task directory): what the sandbox identity must own while it
// runs, given with Give and taken back with Reclaim.
func WritableDirs(mounts []sandbox.Mount) []string {
	var dirs []string
	for _, m := range mounts {
		if fi, err := os.Stat(m.Source); !m.ReadOnly && err == nil && fi.IsDir() {
			dirs = append(dirs, m.Source)
		}
	}
	return dirs
}

// Tree is a directory tree given to the sandbox identity To, and who
// owned its top before: Reclaim gives back to Owner what To owns in it.
type Tree struct {
	Dir   string   `json:"dir"`
	Owner Identity `json:"owner"`
	// To is the sandbox identity; zero in state written before trees
	// recorded it, and then every entry is taken back.
	To Identity `json:"to,omitzero"`
	// Dev and Ino identify the directory given, so Reclaim takes back
	// that one or none (zero in older state).
	Dev uint64 `json:"dev,omitempty"`
	Ino uint64 `json:"ino,omitempty"`
	// Mode is the top's permissions before Give closed it to the sandbox
	// alone, which Reclaim puts back (zero in older state: left as is).
	Mode uint32 `json:"mode,omitempty"`
}

// UnmarshalJSON also reads a bare directory, as state written before trees
// had owners records it: the server owned those.
func (t *Tree) UnmarshalJSON(b []byte) error {
	var dir string
	if json.Unmarshal(b, &dir) == nil {
		*t = Tree{Dir: dir, Owner: server()}
		return nil
	}
	type plain Tree
	return json.Unmarshal(b, (*plain)(t))
}

// server is the server's own identity.
func server() Identity { return Identity{UID: os.Geteuid(), GID: os.Getegid()} }

// Give makes each directory tree in dirs owned by id, so the sandbox can
// write what the server prepared, and returns the trees with their owners
// before, for Reclaim: also on error, the trees it changed. Only what the
// top's owner owns changes hands (and what a sandbox's identity owns, left
// by one before): a file of a third person in a person's workspace stays
// theirs. A tree a sandbox identity owns already (left by a server that
// died before taking it back) goes back to the server. The top is closed
// to all but id (mode 0700) while it is id's: sandboxes each of their own
// identity reach none of each other's trees. The tree is walked by
// descriptor (walkTree): no link is followed, at any component, however
// its owner changes it meanwhile. A missing directory is skipped; a link
// in place of one is refused.
func Give(dirs []string, id Identity) ([]Tree, error) {
	var trees []Tree
	for _, dir := range dirs {
		fd, err := openDir(dir)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return trees, fmt.Errorf("give %s to the sandbox identity %s: %w", dir, id, err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return trees, fmt.Errorf("give %s to the sandbox identity %s: %w", dir, id, err)
		}
		owner := Identity{UID: int(st.Uid), GID: int(st.Gid)}
		left := id.Switch() && (owner == id || InRange(owner.UID))
		if left {
			owner = server()
		}
		trees = append(trees, Tree{Dir: dir, Owner: owner, To: id, Dev: st.Dev, Ino: st.Ino, Mode: st.Mode & 0o7777})
		give := func(fd int, name string, st *unix.Stat_t) error {
			uid := int(st.Uid)
			if (uid != owner.UID && !(id.Switch() && InRange(uid))) || (uid == id.UID && int(st.Gid) == id.GID) {
				return nil
			}
			if name == "" {
				return unix.Fchown(fd, id.UID, id.GID)
			}
			return unix.Fchownat(fd, name, id.UID, id.GID, unix.AT_SYMLINK_NOFOLLOW)
		}
		err = walkTree(fd, dir, visitor{
			enter: func(fd int, st *unix.Stat_t) error { return give(fd, "", st) },
			leave: func(int, *unix.Stat_t) error { return nil },
			entry: give,
		})
		if err == nil {
			err = unix.Fchmod(fd, 0o700)
		}
		unix.Close(fd)
		if err != nil {
			return trees, fmt.Errorf("give %s to the sandbox identity %s: %w", dir, id, err)
		}
	}
	return trees, nil
}

// unsafeBits are the mode bits Reclaim removes: set-uid, set-gid, sticky,
// and write permission for group and others.
const unsafeBits = fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky | 0o022

// unsafeMode is unsafeBits as the kernel's st_mode bits.
const unsafeMode = unix.S_ISUID | unix.S_ISGID | unix.S_ISVTX | 0o022

// Reclaim takes each tree back from a sandbox that is gone. Of every entry
// the sandbox identity owns, the set-uid, set-gid and sticky bits and group
// and other write permission are removed and the tree's owner becomes its
// owner; special files it made (FIFOs, sockets) are removed: nothing on the
// host reads them. Entries of anyone else are left as they are. Symbolic
// links are not followed and keep no meaning (their mode is not used by
// Linux).
//
// The walk is by descriptor (walkTree) and safe against the owner racing
// it: a directory is closed to group and others before its entries are
// walked and given to the owner only after them, so nothing beneath can
// be renamed by anyone but root while the walk is there, and the top goes
// back last. An entry that cannot be taken back does not stop the walk;
// a tree with any such entry is quarantined (sandbox.ErrQuarantined): its
// top left to the server alone (mode 0700). A missing
// directory is skipped.
func Reclaim(trees []Tree) error {
	var errs []error
	for _, t := range trees {
		if err := t.reclaim(); err != nil {
			errs = append(errs, fmt.Errorf("reclaim %s from the sandbox identity: %w", t.Dir, err))
		}
	}
	return errors.Join(errs...)
}

func (t Tree) reclaim() error {
	fd, err := openDir(t.Dir)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if t.Ino != 0 && (st.Dev != t.Dev || st.Ino != t.Ino) {
		// A pin lost with a restart of the host, or a directory replaced
		// by root: what the sandbox was given is not here to take back.
		return fmt.Errorf("not the directory the sandbox was given (device %d inode %d, not %d %d); not taken back: %w", st.Dev, st.Ino, t.Dev, t.Ino, errReplaced)
	}
	uid, gid := t.Owner.UID, t.Owner.GID
	mine := func(st *unix.Stat_t) bool { return t.To == (Identity{}) || int(st.Uid) == t.To.UID }
	err = walkTree(fd, t.Dir, visitor{
		enter: func(fd int, st *unix.Stat_t) error {
			if !mine(st) || st.Mode&unsafeMode == 0 {
				return nil
			}
			return unix.Fchmod(fd, st.Mode&0o7777&^unsafeMode)
		},
		leave: func(fd int, st *unix.Stat_t) error {
			if t.Mode != 0 && st.Dev == t.Dev && st.Ino == t.Ino {
				// The top: its permissions from before Give, its
				// owner's choice.
				if err := unix.Fchmod(fd, t.Mode); err != nil {
					return err
				}
			}
			if !mine(st) || (int(st.Uid) == uid && int(st.Gid) == gid) {
				return nil
			}
			return unix.Fchown(fd, uid, gid)
		},
		entry: func(dirfd int, name string, st *unix.Stat_t) error {
			if !mine(st) {
				return nil
			}
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFLNK:
				return unix.Fchownat(dirfd, name, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
			case unix.S_IFREG:
				return reclaimFile(dirfd, name, st, uid, gid)
			default: // FIFOs, sockets, devices
				return unix.Unlinkat(dirfd, name, 0)
			}
		},
	})
	if err != nil {
		return errors.Join(err, quarantine(fd))
	}
	return nil
}

// reclaimFile takes a regular file back: held by an O_PATH descriptor,
// checked to be the file the walk saw, its unsafe bits removed first
// (chmod before chown) and then its owner changed.
func reclaimFile(dirfd int, name string, st *unix.Stat_t, uid, gid int) error {
	fd, err := unix.Openat(dirfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var held unix.Stat_t
	if err := unix.Fstat(fd, &held); err != nil {
		return err
	}
	if held.Dev != st.Dev || held.Ino != st.Ino || held.Mode&unix.S_IFMT != unix.S_IFREG {
		return errReplaced
	}
	if held.Mode&unsafeMode != 0 {
		if err := chmodHeld(fd, held.Mode&0o7777&^unsafeMode); err != nil {
			return err
		}
	}
	return unix.Fchownat(fd, "", uid, gid, unix.AT_EMPTY_PATH)
}

// quarantine closes the tree open at fd to all but the server, and says so.
func quarantine(fd int) error {
	s := server()
	if err := unix.Fchown(fd, s.UID, s.GID); err != nil {
		return fmt.Errorf("quarantine: %w", err)
	}
	if err := unix.Fchmod(fd, 0o700); err != nil {
		return fmt.Errorf("quarantine: %w", err)
	}
	return sandbox.ErrQuarantined
}

// Reach returns nil if id can reach path the way a sandbox's runtime
// needs: search permission on every directory on the way (symbolic links
// resolved), and the permission bits want (r=4, w=2, x=1) on path itself.
// Otherwise it names the first directory or file in the way and its mode.
// It only inspects permission bits and owners (no ACLs), which is what
// Corral's own directories use.
func (id Identity) Reach(path string, want fs.FileMode) error {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return err
	}
	dirs := []string{}
	for d := filepath.Dir(real); ; d = filepath.Dir(d) {
		dirs = append(dirs, d)
		if d == "/" || d == "." {
			break
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := id.allowed(dirs[i], 0o1); err != nil {
			return err
		}
	}
	return id.allowed(real, want)
}

// allowed checks the permission bits want (r=4, w=2, x=1) for id on path,
// as the kernel would for an unprivileged process.
func (id Identity) allowed(path string, want fs.FileMode) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	perm := fi.Mode().Perm()
	var bits fs.FileMode
	switch {
	case int(st.Uid) == id.UID:
		bits = perm >> 6
	case int(st.Gid) == id.GID:
		bits = perm >> 3
	default:
		bits = perm
	}
	if bits&want != want {
		return fmt.Errorf("%s (owner %d:%d, mode %v) is closed to the sandbox identity %s", path, st.Uid, st.Gid, perm, id)
	}
	return nil
}

// ValidateSpec returns every problem with spec at once: Spec.Validate's,
// mount sources that do not exist under root (the data root), and, when
// sandboxes run as another host identity than the server, read-only mount
// sources that identity cannot reach (a runtime running as it binds them by
// path). Read-write sources are given to the identity at start.
func (host Identity) ValidateSpec(spec sandbox.Spec, root string) error {
	errs := []error{spec.Validate()}
	for i, m := range spec.Resolve(root).Mounts {
		if !spec.Mounts[i].HostDir && !filepath.IsLocal(filepath.FromSlash(spec.Mounts[i].Source)) {
			continue
		}
		field := fmt.Sprintf("mounts[%d].source", i)
		fi, err := os.Stat(m.Source)
		if err != nil {
			errs = append(errs, errdefs.Field(field, "does not exist"))
			continue
		}
		if !host.Switch() {
			continue
		}
		want := fs.FileMode(0o4)
		if fi.IsDir() {
			want = 0o5
		}
		if m.ReadOnly {
			err = host.Reach(m.Source, want)
		} else {
			err = host.Reach(filepath.Dir(m.Source), 0o1)
		}
		if err != nil {
			errs = append(errs, errdefs.Field(field, err.Error()))
		}
	}
	return errors.Join(errs...)
}
