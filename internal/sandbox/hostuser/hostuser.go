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

// Tree is a directory tree given to the sandbox identity, and who owned
// its top before: Reclaim gives the whole tree back to Owner.
type Tree struct {
	Dir   string   `json:"dir"`
	Owner Identity `json:"owner"`
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
// before, for Reclaim: also on error, the trees it changed. A tree that id
// owns already (left by a server that died before taking it back) goes
// back to the server. Symbolic links are not followed (the trees are the
// server's own at this point). A missing directory is skipped.
func Give(dirs []string, id Identity) ([]Tree, error) {
	var trees []Tree
	for _, dir := range dirs {
		fi, err := os.Lstat(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if err != nil || !ok {
			return trees, fmt.Errorf("give %s to the sandbox identity %s: %v", dir, id, err)
		}
		owner := Identity{UID: int(st.Uid), GID: int(st.Gid)}
		if owner == id && id.Switch() {
			owner = server()
		}
		trees = append(trees, Tree{Dir: dir, Owner: owner})
		err = walk(dir, func(p string, d fs.DirEntry) error { return os.Lchown(p, id.UID, id.GID) })
		if err != nil {
			return trees, fmt.Errorf("give %s to the sandbox identity %s: %w", dir, id, err)
		}
	}
	return trees, nil
}

// unsafeBits are the mode bits Reclaim removes: set-uid, set-gid, sticky,
// and write permission for group and others.
const unsafeBits = fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky | 0o022

// Reclaim takes each tree back from a sandbox that is gone: every entry's
// set-uid, set-gid and sticky bits and group and other write permission
// are removed, and every entry is owned by the tree's owner. Symbolic
// links are not followed and keep no meaning (their mode is not used by
// Linux). Special files (FIFOs, sockets, devices a worker could not have
// made) are removed: nothing on the host reads them. A missing directory
// is skipped; errors are joined and the walk goes on.
func Reclaim(trees []Tree) error {
	var errs []error
	for _, t := range trees {
		dir, uid, gid := t.Dir, t.Owner.UID, t.Owner.GID
		err := walk(dir, func(p string, d fs.DirEntry) error {
			info, err := d.Info()
			if err != nil {
				return err
			}
			mode := info.Mode()
			switch {
			case mode&fs.ModeSymlink != 0:
				return os.Lchown(p, uid, gid)
			case mode&(fs.ModeNamedPipe|fs.ModeSocket|fs.ModeDevice|fs.ModeCharDevice) != 0:
				return os.Remove(p)
			}
			// Chmod before chown, and on a path the worker can no
			// longer change: the sandbox is gone.
			if mode&unsafeBits != 0 {
				if err := os.Chmod(p, mode.Perm()&^0o022); err != nil {
					return err
				}
			}
			return os.Lchown(p, uid, gid)
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("reclaim %s from the sandbox identity: %w", dir, err))
		}
	}
	return errors.Join(errs...)
}

// walk calls fn for dir and everything beneath it, without following
// symbolic links; a missing dir is no error.
func walk(dir string, fn func(string, fs.DirEntry) error) error {
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir && errors.Is(err, fs.ErrNotExist) {
				return fs.SkipAll
			}
			return err
		}
		return fn(p, d)
	})
	return err
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
