// Package quota holds a directory to a disk limit in the kernel, with
// project quotas: ext4 made with `-O quota,project` and mounted with
// `prjquota`, or XFS mounted with `pquota`. The directory and everything
// beneath it get a project id of their own (FS_IOC_FSSETXATTR with
// FS_XFLAG_PROJINHERIT, so what is created later inherits it), and the
// project gets hard block and inode limits (quotactl_fd, Q_SETQUOTA on
// PRJQUOTA): a write past them fails with EDQUOT, whoever makes it, unless
// the writer holds CAP_SYS_RESOURCE on the host.
//
// Project ids are chosen by a hash of a caller's key (a task id) with a
// collision check against the filesystem itself: an id is free only while
// its project has no usage and no limits. Nothing is persisted: the id a
// directory has is read back from the directory.
//
// It needs Linux 5.14 or newer (quotactl_fd) and CAP_SYS_ADMIN.
package quota

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Limits are a project's hard limits; zero means none.
type Limits struct {
	Bytes  int64
	Inodes int64
}

// Usage is what a project holds: bytes of blocks allocated or reserved,
// and inodes.
type Usage struct {
	Bytes  int64
	Inodes int64
}

// From linux/fs.h, linux/quota.h and linux/dqblk_xfs.h; golang.org/x/sys
// has none of them.
const (
	fsIocFsGetXattr    = 0x801c581f // _IOR('X', 31, struct fsxattr)
	fsIocFsSetXattr    = 0x401c5820 // _IOW('X', 32, struct fsxattr)
	fsXflagProjInherit = 0x00000200

	prjQuota    = 2
	qGetQuota   = 0x800007
	qSetQuota   = 0x800008
	qXGetQStatV = 0x5808 // XQM_CMD(8)
	qifLimits   = 1 | 4  // QIF_BLIMITS | QIF_ILIMITS
	blockUnit   = 1024   // QIF_DQBLKSIZE: the unit of dqb_*limit

	fsQStatVVersion1 = 1
	fsQuotaPdqAcct   = 1 << 4
	fsQuotaPdqEnfd   = 1 << 5
)

// Project ids Corral hands out: above the small ids people give by hand
// in /etc/projid, within 31 bits.
const (
	firstID = 1 << 24
	idSpan  = 1<<31 - firstID
	probes  = 64
)

// fsxattr is struct fsxattr.
type fsxattr struct {
	Xflags     uint32
	Extsize    uint32
	Nextents   uint32
	Projid     uint32
	Cowextsize uint32
	_          [8]byte
}

// dqblk is struct if_dqblk.
type dqblk struct {
	BHardLimit uint64
	BSoftLimit uint64
	CurSpace   uint64
	IHardLimit uint64
	ISoftLimit uint64
	CurInodes  uint64
	BTime      uint64
	ITime      uint64
	Valid      uint32
	_          uint32
}

// qfilestatv is struct fs_qfilestatv.
type qfilestatv struct {
	Ino      uint64
	Nblks    uint64
	Nextents uint32
	_        uint32
}

// quotaStatV is struct fs_quota_statv.
type quotaStatV struct {
	Version      int8
	_            uint8
	Flags        uint16
	Incoredqs    uint32
	UQuota       qfilestatv
	GQuota       qfilestatv
	BTimeLimit   int32
	ITimeLimit   int32
	RTBTimeLimit int32
	BWarnLimit   uint16
	IWarnLimit   uint16
	RTBWarnLimit uint16
	_            uint16
	_            uint32
	PQuota       qfilestatv
	_            [7]uint64
}

// Projects hands out project ids and limits on one filesystem. It is safe
// for concurrent use.
type Projects struct {
	mu sync.Mutex
}

// Open returns Projects for the filesystem that holds path if it enforces
// project quotas and this process may set them, or an error that says why
// not.
func Open(path string) (*Projects, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var st quotaStatV
	st.Version = fsQStatVVersion1
	if err := quotactl(f, qXGetQStatV, 0, unsafe.Pointer(&st)); err != nil {
		return nil, fmt.Errorf("%s: cannot read its quota state: %w", path, explain(err))
	}
	if st.Flags&fsQuotaPdqEnfd == 0 || st.Flags&fsQuotaPdqAcct == 0 {
		return nil, fmt.Errorf("%s: project quotas are not enforced on its filesystem (ext4: mkfs.ext4 -O quota,project and mount -o prjquota; XFS: mount -o pquota)", path)
	}
	if _, err := getLimits(f, firstID); err != nil {
		return nil, fmt.Errorf("%s: cannot read project quotas: %w", path, explain(err))
	}
	if _, err := Project(f); err != nil {
		return nil, fmt.Errorf("%s: cannot read project ids: %w", path, explain(err))
	}
	return &Projects{}, nil
}

// explain adds what a person can do to the errors Open meets.
func explain(err error) error {
	switch {
	case errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("%w (the filesystem has no quota support, or the kernel is older than 5.14 and has no quotactl_fd)", err)
	case errors.Is(err, unix.EPERM):
		return fmt.Errorf("%w (setting quotas needs root)", err)
	case errors.Is(err, unix.ESRCH):
		return fmt.Errorf("%w (project quotas are off on this filesystem)", err)
	}
	return err
}

// Assign gives dir, and every directory and regular file beneath it, a
// project id of its own, chosen from key, and sets that project's limits
// first, so nothing under it is ever unlimited. Directories inherit the
// id into what is created in them later. It returns the id. Nothing may
// write under dir meanwhile: Assign does not follow symbolic links and
// leaves other kinds of files (which hold no blocks) alone.
func (p *Projects) Assign(dir *os.File, key string, lim Limits) (uint32, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id, err := freeID(dir, key)
	if err != nil {
		return 0, err
	}
	if err := setLimits(dir, id, lim); err != nil {
		return 0, fmt.Errorf("set the limits of project %d: %w", id, err)
	}
	if err := setTree(dir, id); err != nil {
		setLimits(dir, id, Limits{})
		return 0, fmt.Errorf("give project %d to %s: %w", id, dir.Name(), err)
	}
	return id, nil
}

// freeID returns the first id from key's hash on whose project nothing
// is held and no limit is set.
func freeID(f *os.File, key string) (uint32, error) {
	h := fnv.New32a()
	io.WriteString(h, key)
	start := h.Sum32() % idSpan
	for i := uint32(0); i < probes; i++ {
		id := firstID + (start+i)%idSpan
		q, err := getQuota(f, id)
		if err != nil {
			return 0, fmt.Errorf("read project %d: %w", id, err)
		}
		if q == (dqblk{}) {
			return id, nil
		}
	}
	return 0, fmt.Errorf("no free project id among %d tried from %d", probes, firstID+start)
}

// Read returns what the project of dir holds and its limits. Project 0
// (no project of its own) is an error: its figures are the filesystem's.
func Read(dir *os.File) (Usage, Limits, error) {
	id, err := Project(dir)
	if err != nil {
		return Usage{}, Limits{}, err
	}
	if id == 0 {
		return Usage{}, Limits{}, fmt.Errorf("%s has no project of its own", dir.Name())
	}
	q, err := getQuota(dir, id)
	if err != nil {
		return Usage{}, Limits{}, fmt.Errorf("read project %d: %w", id, err)
	}
	return Usage{Bytes: int64(q.CurSpace), Inodes: int64(q.CurInodes)},
		Limits{Bytes: int64(q.BHardLimit) * blockUnit, Inodes: int64(q.IHardLimit)}, nil
}

// Clear removes the limits of dir's project. The directory keeps its id,
// and its files stay counted against it, until it is removed; the id is
// free again then.
func (p *Projects) Clear(dir *os.File) error {
	id, err := Project(dir)
	if err != nil || id == 0 {
		return err
	}
	return setLimits(dir, id, Limits{})
}

// Project returns the project id of an open file.
func Project(f *os.File) (uint32, error) {
	x, err := getXattr(int(f.Fd()))
	return x.Projid, err
}

// CopyProject gives the directory dst the project of the directory src,
// inherited by what is created in it, as Assign gave src: for a directory
// that takes src's place (its entries moved in, then renamed over it).
// Nothing to do where src has no project of its own.
func CopyProject(dst, src *os.File) error {
	x, err := getXattr(int(src.Fd()))
	if err != nil || x.Projid == 0 {
		return nil // no project quotas here, or none on src
	}
	y, err := getXattr(int(dst.Fd()))
	if err != nil {
		return err
	}
	y.Projid = x.Projid
	y.Xflags |= x.Xflags & fsXflagProjInherit
	return ioctlPtr(int(dst.Fd()), fsIocFsSetXattr, unsafe.Pointer(&y))
}

// setTree gives dir and what is beneath it project id.
func setTree(dir *os.File, id uint32) error {
	return walkFDs(int(dir.Fd()), func(fd int, isDir bool) error {
		x, err := getXattr(fd)
		if err != nil {
			return err
		}
		x.Projid = id
		if isDir {
			x.Xflags |= fsXflagProjInherit
		}
		return ioctlPtr(fd, fsIocFsSetXattr, unsafe.Pointer(&x))
	})
}

// walkFDs calls fn on fd, a directory, and on every directory and regular
// file beneath it, opened without following symbolic links.
func walkFDs(fd int, fn func(fd int, isDir bool) error) error {
	if err := fn(fd, true); err != nil {
		return err
	}
	names, err := dirNames(fd)
	if err != nil {
		return err
	}
	for _, name := range names {
		c, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENXIO) || errors.Is(err, unix.ENOENT) {
			continue // a symbolic link, a socket, gone
		}
		if err != nil {
			return fmt.Errorf("open %s: %w", name, err)
		}
		err = visit(c, fn)
		unix.Close(c)
		if err != nil {
			return err
		}
	}
	return nil
}

// visit calls fn on an open regular file, or walks an open directory.
func visit(fd int, fn func(fd int, isDir bool) error) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return walkFDs(fd, fn)
	case unix.S_IFREG:
		return fn(fd, false)
	}
	return nil
}

// dirNames lists the directory open as fd, leaving fd open.
func dirNames(fd int) ([]string, error) {
	d, err := unix.Openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(d), ".")
	defer f.Close()
	return f.Readdirnames(-1)
}

func getXattr(fd int) (fsxattr, error) {
	var x fsxattr
	err := ioctlPtr(fd, fsIocFsGetXattr, unsafe.Pointer(&x))
	return x, err
}

func ioctlPtr(fd int, req uintptr, arg unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); e != 0 {
		return e
	}
	return nil
}

func getQuota(f *os.File, id uint32) (dqblk, error) {
	var q dqblk
	err := quotactl(f, qGetQuota, id, unsafe.Pointer(&q))
	if errors.Is(err, unix.ENOENT) {
		return dqblk{}, nil // XFS: no dquot for the id yet
	}
	return q, err
}

func getLimits(f *os.File, id uint32) (Limits, error) {
	q, err := getQuota(f, id)
	return Limits{Bytes: int64(q.BHardLimit) * blockUnit, Inodes: int64(q.IHardLimit)}, err
}

func setLimits(f *os.File, id uint32, lim Limits) error {
	q := dqblk{
		BHardLimit: uint64((lim.Bytes + blockUnit - 1) / blockUnit),
		IHardLimit: uint64(lim.Inodes),
		Valid:      qifLimits,
	}
	return quotactl(f, qSetQuota, id, unsafe.Pointer(&q))
}

// quotactl is quotactl_fd(2) on the filesystem of f for project quotas.
func quotactl(f *os.File, cmd int, id uint32, addr unsafe.Pointer) error {
	qcmd := cmd<<8 | prjQuota
	if _, _, e := unix.Syscall6(unix.SYS_QUOTACTL_FD, f.Fd(), uintptr(qcmd), uintptr(id), uintptr(addr), 0, 0); e != 0 {
		return e
	}
	return nil
}
