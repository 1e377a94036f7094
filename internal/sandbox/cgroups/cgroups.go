//go:build linux

// Package cgroups creates, limits, inspects and removes the per-sandbox
// cgroups of the host runtimes (sandbox/local, sandbox/gvisor), on cgroup v1
// (one hierarchy per controller) or v2 (one unified hierarchy).
//
// A sandbox's cgroups are named by their directories, which Create returns
// and the runtime persists in its state; the functions that read or remove
// them take those directories, so they work after a server restart.
package cgroups

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
)

// PeriodUs is the CFS period for CPU limits: 100 ms, the kernel default, so
// a 500-millicore limit is 50 ms of CPU every 100 ms.
const PeriodUs = 100000

// V1Controllers are the v1 hierarchies a sandbox gets a cgroup in, in the
// order of the directories Create returns on v1.
var V1Controllers = []string{"memory", "pids", "cpu"}

// Hierarchy creates per-sandbox cgroups under one parent cgroup. It holds no
// mutable state and is safe for concurrent use.
type Hierarchy struct {
	root   string // cgroupfs mount point, e.g. /sys/fs/cgroup
	parent string // relative path of the parent cgroup, e.g. "corral"
	v2     bool
}

// Detect inspects the cgroupfs mounted at root: v2 if root/cgroup.controllers
// exists, else v1 hierarchies root/{memory,pids,cpu}. parent is the parent
// cgroup of every sandbox's cgroup, relative to the hierarchy's root.
func Detect(root, parent string) (*Hierarchy, error) {
	parent = filepath.Clean(parent)
	if parent == "." || !filepath.IsLocal(parent) {
		return nil, fmt.Errorf("cgroup parent %q: must be a relative path: %w", parent, errdefs.ErrInvalidArgument)
	}
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		return &Hierarchy{root: root, parent: parent, v2: true}, nil
	}
	for _, c := range V1Controllers {
		if _, err := os.Stat(filepath.Join(root, c, "cgroup.procs")); err != nil {
			return nil, fmt.Errorf("find cgroup v1 %s hierarchy under %s: %w", c, root, errdefs.ErrUnavailable)
		}
	}
	return &Hierarchy{root: root, parent: parent}, nil
}

// V2 reports whether h is the unified (v2) hierarchy.
func (h *Hierarchy) V2() bool { return h.v2 }

// Path is the path of sandbox id's cgroup from the hierarchy's root, as an
// OCI runtime's linux.cgroupsPath wants it: "/<parent>/<id>".
func (h *Hierarchy) Path(id string) string { return "/" + filepath.Join(h.parent, id) }

// Prepare creates the parent cgroup(s) and, on v2, enables the memory, pids
// and cpu controllers from the root down to the parent's children. It
// proves the hierarchy is writable.
func (h *Hierarchy) Prepare() error {
	if !h.v2 {
		for _, ctl := range V1Controllers {
			if err := os.MkdirAll(filepath.Join(h.root, ctl, h.parent), 0o755); err != nil {
				return fmt.Errorf("create cgroup %s/%s: %w", ctl, h.parent, err)
			}
		}
		return nil
	}
	if err := os.MkdirAll(filepath.Join(h.root, h.parent), 0o755); err != nil {
		return fmt.Errorf("create cgroup %s: %w", h.parent, err)
	}
	// Every cgroup from the root down to the parent must delegate the
	// controllers to its children: root -> corral -> corral/<id>.
	dir := h.root
	for _, elem := range append([]string{""}, strings.Split(h.parent, string(filepath.Separator))...) {
		dir = filepath.Join(dir, elem)
		if err := enableControllers(dir); err != nil {
			return err
		}
	}
	return nil
}

// enableControllers writes "+memory +pids +cpu" (those not yet enabled) to
// dir/cgroup.subtree_control.
func enableControllers(dir string) error {
	ctlFile := filepath.Join(dir, "cgroup.subtree_control")
	cur, err := os.ReadFile(ctlFile)
	if err != nil {
		return fmt.Errorf("read %s: %w", ctlFile, err)
	}
	enabled := strings.Fields(string(cur))
	var add []string
	for _, want := range []string{"memory", "pids", "cpu"} {
		found := false
		for _, e := range enabled {
			found = found || e == want
		}
		if !found {
			add = append(add, "+"+want)
		}
	}
	if len(add) == 0 {
		return nil
	}
	return writeFile(ctlFile, strings.Join(add, " "))
}

// Dirs returns the cgroup directories (absolute) of the sandbox id, as
// Create makes them: one on v2, the memory, pids and cpu ones on v1.
func (h *Hierarchy) Dirs(id string) []string {
	if h.v2 {
		return []string{filepath.Join(h.root, h.parent, id)}
	}
	var dirs []string
	for _, ctl := range V1Controllers {
		dirs = append(dirs, filepath.Join(h.root, ctl, h.parent, id))
	}
	return dirs
}

// Leftovers returns the ids of the sandbox cgroups under the parent that
// hold no process and were made more than minAge ago. A sandbox has a
// process in its cgroups from the moment its launcher joins them until it
// is destroyed, so these are what a destroy could not remove, or what an
// older build leaked when a start failed. On v1 every write of a CPU
// quota walks all cpu cgroups, so many of them slow every sandbox's start.
func (h *Hierarchy) Leftovers(minAge time.Duration) []string {
	base := filepath.Join(h.root, h.parent)
	if !h.v2 {
		base = filepath.Join(h.root, V1Controllers[0], h.parent) // as any controller's
	}
	ents, err := os.ReadDir(base)
	if err != nil {
		return nil
	}
	var ids []string
	for _, e := range ents {
		if !e.IsDir() || sandbox.ValidateID(e.Name()) != nil {
			continue
		}
		fi, err := e.Info()
		if err != nil || time.Since(fi.ModTime()) < minAge {
			continue
		}
		dirs := h.Dirs(e.Name())
		if _, err := os.Stat(filepath.Join(dirs[0], "cgroup.procs")); err == nil && len(Pids(dirs)) == 0 {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

// Create makes the sandbox's cgroup(s) for id and writes the limits lim
// (memory without swap, pids, CPU quota; zero fields are not limited). It
// returns the cgroup directories (absolute), which the caller persists: one
// on v2, the memory, pids and cpu ones on v1.
func (h *Hierarchy) Create(id string, lim sandbox.Limits) (dirs []string, err error) {
	dirs = h.Dirs(id)
	for _, d := range dirs {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("create cgroup %s: %w", d, err)
		}
	}
	defer func() {
		if err != nil {
			Remove(dirs)
		}
	}()
	if h.v2 {
		err = writeLimitsV2(dirs[0], lim)
	} else {
		err = writeLimitsV1(dirs[0], dirs[1], dirs[2], lim)
	}
	if err != nil {
		return nil, err
	}
	return dirs, nil
}

// Background sets whether the sandbox of dirs (Create's) runs in the
// background: with the least CPU weight there is (v1 cpu.shares 2, v2
// cpu.weight 1), so that when CPU is short it gets what the host's other
// work leaves, or, on false, with the default weight again (1024, 100). A
// warm sandbox starts in the background, so the sandboxes started ahead of
// need never take CPU from the tasks running now, and leaves it when a
// task claims it.
func (h *Hierarchy) Background(dirs []string, on bool) error {
	file, least, normal := filepath.Join(dirs[0], "cpu.weight"), "1", "100"
	if !h.v2 {
		file, least, normal = filepath.Join(dirs[2], "cpu.shares"), "2", "1024"
	}
	if on {
		return writeFile(file, least)
	}
	return writeFile(file, normal)
}

// RaiseMemory raises the memory limit of a sandbox's cgroups (dirs, as
// Create returns them) by what the sandbox uses now, at most doubling it,
// and returns how to put the limit back. It is for a sandbox paused while
// its runtime saves it: the save's own buffers and the image's page cache
// are charged to the sandbox, and at its limit they got the saver
// OOM-killed mid-save. A sandbox without a memory limit is left as it is
// (put back is then a no-op), as is one whose cgroups are gone.
//
// What put back writes is written down first in the file record (a
// server's own, the directory there), and put back removes it: a process
// that dies between the two leaves it for PutBack, which its successor
// calls when it finds the sandbox still running. A save that ended its
// sandbox removes the record with the sandbox's state.
func RaiseMemory(dirs []string, record string) (putBack func() error, err error) {
	noop := func() error { return nil }
	if len(dirs) == 0 {
		return noop, nil
	}
	dir := dirs[0] // v2's one, or v1's memory controller's
	r := raise{Dir: dir, LimitFile: "memory.max"}
	usageFile := "memory.current"
	if _, err := os.Stat(filepath.Join(dir, r.LimitFile)); err != nil {
		r.LimitFile, usageFile = "memory.limit_in_bytes", "memory.usage_in_bytes"
	}
	limit, ok := readInt(filepath.Join(dir, r.LimitFile))
	usage, uok := readInt(filepath.Join(dir, usageFile))
	if !ok || !uok || limit <= 0 || limit >= unlimitedV1 {
		return noop, nil // "max", v1's "no limit", or no such cgroup
	}
	r.Limit = limit
	raised := limit + min(usage, limit)
	// v1's memory+swap limit must stay at or above the memory limit: when
	// it is below the raised one, it goes up first and back down last,
	// to what it was (an engine's container may allow swap above its
	// memory limit).
	if r.LimitFile == "memory.limit_in_bytes" {
		if swap, ok := readInt(filepath.Join(dir, "memory.memsw.limit_in_bytes")); ok && swap < raised {
			r.SwapFile, r.Swap = "memory.memsw.limit_in_bytes", swap
		}
	}
	b, _ := json.Marshal(r)
	if err := os.WriteFile(record, b, 0o600); err != nil {
		return noop, fmt.Errorf("write down a memory limit's raise: %w", err)
	}
	if err := r.set(r.SwapFile, raised); err != nil {
		os.Remove(record)
		return noop, err
	}
	if err := r.set(r.LimitFile, raised); err != nil {
		r.putBack(record)
		return noop, err
	}
	return func() error { return r.putBack(record) }, nil
}

// PutBack puts back a memory limit RaiseMemory raised and wrote down in
// record, which a process that died before putting it back left; nothing
// when there is no record. A cgroup gone since (its sandbox ended) is
// nothing to put back.
func PutBack(record string) error {
	b, err := os.ReadFile(record)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	// The record is the server's own; still, it names nothing but a
	// memory cgroup's limit files.
	var r raise
	err = json.Unmarshal(b, &r)
	if err == nil && (!filepath.IsAbs(r.Dir) || r.LimitFile != "memory.max" && r.LimitFile != "memory.limit_in_bytes" ||
		r.SwapFile != "" && r.SwapFile != "memory.memsw.limit_in_bytes") {
		err = errors.New("not a memory cgroup's limits")
	}
	if err != nil {
		os.Remove(record)
		return fmt.Errorf("a memory limit's raise written down in %s: %w", record, err)
	}
	if err := r.putBack(record); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		os.Remove(record)
	}
	return nil
}

// raise is what RaiseMemory writes down: the memory cgroup, and the
// limits to put back (SwapFile "" when v1's memory+swap limit was left).
type raise struct {
	Dir       string `json:"dir"`
	LimitFile string `json:"limit_file"`
	Limit     int64  `json:"limit"`
	SwapFile  string `json:"swap_file,omitempty"`
	Swap      int64  `json:"swap,omitempty"`
}

// set writes v to the cgroup's file name; nothing for "".
func (r raise) set(name string, v int64) error {
	if name == "" {
		return nil
	}
	return writeFile(filepath.Join(r.Dir, name), strconv.FormatInt(v, 10))
}

// putBack writes the limits back, the memory limit first, and removes the
// record once they are.
func (r raise) putBack(record string) error {
	if err := r.set(r.LimitFile, r.Limit); err != nil {
		return err
	}
	if err := r.set(r.SwapFile, r.Swap); err != nil {
		return err
	}
	return os.Remove(record)
}

// readInt reads the number a cgroup file holds.
func readInt(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil
}

// MemoryOf returns the memory cgroup directory of process pid under the
// cgroup file system at root (/sys/fs/cgroup): cgroup v1's memory
// controller's, or v2's, from /proc/<pid>/cgroup; as a list, for
// RaiseMemory. A container engine's container is found so.
func MemoryOf(root string, pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return nil, fmt.Errorf("find the memory cgroup of process %d: %w", pid, err)
	}
	v2 := ""
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if slices.Contains(strings.Split(parts[1], ","), "memory") {
			return []string{filepath.Join(root, "memory", parts[2])}, nil
		}
		if parts[0] == "0" && parts[1] == "" {
			v2 = parts[2]
		}
	}
	if v2 != "" {
		if _, err := os.Stat(filepath.Join(root, v2, "memory.max")); err == nil {
			return []string{filepath.Join(root, v2)}, nil
		}
	}
	return nil, fmt.Errorf("process %d is in no memory cgroup", pid)
}

// unlimitedV1 is where cgroup v1 memory limits start to mean none (the
// kernel reports no limit as 2^63-1 rounded down to a page).
const unlimitedV1 = 1 << 62

func writeLimitsV2(dir string, lim sandbox.Limits) error {
	if lim.MemoryBytes > 0 {
		if err := writeFile(filepath.Join(dir, "memory.max"), strconv.FormatInt(lim.MemoryBytes, 10)); err != nil {
			return err
		}
		// Without swap.max=0 a memory-limited sandbox swaps instead of
		// being OOM-killed. The file exists only with swap accounting.
		if err := writeIfExists(filepath.Join(dir, "memory.swap.max"), "0"); err != nil {
			return err
		}
	}
	if lim.Pids > 0 {
		if err := writeFile(filepath.Join(dir, "pids.max"), strconv.FormatInt(lim.Pids, 10)); err != nil {
			return err
		}
	}
	if lim.CPUMillis > 0 {
		quota := lim.CPUMillis * PeriodUs / 1000
		if err := writeFile(filepath.Join(dir, "cpu.max"), fmt.Sprintf("%d %d", quota, PeriodUs)); err != nil {
			return err
		}
	}
	return nil
}

func writeLimitsV1(memDir, pidsDir, cpuDir string, lim sandbox.Limits) error {
	if lim.MemoryBytes > 0 {
		v := strconv.FormatInt(lim.MemoryBytes, 10)
		if err := writeFile(filepath.Join(memDir, "memory.limit_in_bytes"), v); err != nil {
			return err
		}
		// memsw (memory+swap) must be >= limit_in_bytes, so it is written
		// second; equal values forbid swap. It exists only with swapaccount.
		if err := writeIfExists(filepath.Join(memDir, "memory.memsw.limit_in_bytes"), v); err != nil {
			return err
		}
	}
	if lim.Pids > 0 {
		if err := writeFile(filepath.Join(pidsDir, "pids.max"), strconv.FormatInt(lim.Pids, 10)); err != nil {
			return err
		}
	}
	if lim.CPUMillis > 0 {
		if err := writeFile(filepath.Join(cpuDir, "cpu.cfs_period_us"), strconv.Itoa(PeriodUs)); err != nil {
			return err
		}
		quota := lim.CPUMillis * PeriodUs / 1000
		if err := writeFile(filepath.Join(cpuDir, "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10)); err != nil {
			return err
		}
	}
	return nil
}

// writeFile writes one value. cgroupfs files exist already; in a fake
// cgroupfs (tests) the file is created.
func writeFile(path, value string) error {
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		return fmt.Errorf("write cgroup file %s: %w", path, err)
	}
	return nil
}

func writeIfExists(path, value string) error {
	if _, err := os.Stat(path); err != nil {
		return nil
	}
	return writeFile(path, value)
}

// Join holds what a launcher needs to start in a sandbox's cgroups, and
// works for a launcher that already runs as the sandbox's host identity
// (the server changes identity as it starts it, with no setuid helper):
//
//   - v2: Dir, the cgroup's directory, for SysProcAttr.CgroupFD. The kernel
//     starts the launcher in the cgroup (clone3's CLONE_INTO_CGROUP, Linux
//     5.7+), so it never moves, and the permission check is the server's.
//   - v1: Tasks, each cgroup's tasks file, open for writing, for the
//     launcher to write "0" (itself) into before it forks, then close. The
//     kernel checks a cgroup file write against the credentials of whoever
//     opened the file (the server), and a process may always move itself.
//
// Why tasks, by the thread itself, on v1: moving a process through
// cgroup.procs, or any task named by its pid, write-locks the kernel's
// global threadgroup semaphore, which first waits for an RCU grace period:
// 5 to 10 ms per sandbox, measured on a busy 2-core host, the largest
// single cost of a trivial task's start. A thread that moves itself ("0"
// into tasks) takes no such lock (kernel commit 9a3284fad42f, "cgroup:
// Optimize single thread migration"; older kernels lock either way), and
// for a process with one thread that moves the whole process. On v2 a
// process born in its cgroup takes no lock either.
type Join struct {
	Dir   *os.File   // v2: the cgroup directory; nil on v1
	Tasks []*os.File // v1: each cgroup's tasks file, write-only
}

// OpenJoin opens what a launcher needs to join the cgroups dirs (see Join):
// a directory with a tasks file is a v1 cgroup, one without is the single
// v2 cgroup. No dirs (a runtime without cgroups) is an empty Join. The
// caller closes it once the launcher has started.
func OpenJoin(dirs []string) (_ *Join, err error) {
	j := &Join{}
	defer func() {
		if err != nil {
			j.Close()
		}
	}()
	for _, d := range dirs {
		f, err := os.OpenFile(filepath.Join(d, "tasks"), os.O_WRONLY, 0)
		if err == nil {
			j.Tasks = append(j.Tasks, f)
			continue
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("open cgroup %s: %w", d, err)
		}
		if j.Dir != nil || len(dirs) != 1 {
			return nil, fmt.Errorf("cgroup %s has no tasks file (v2), but the sandbox has %d cgroups: %w", d, len(dirs), errdefs.ErrFailedPrecondition)
		}
		if j.Dir, err = os.OpenFile(d, os.O_RDONLY|syscall.O_DIRECTORY, 0); err != nil {
			return nil, fmt.Errorf("open cgroup %s: %w", d, err)
		}
	}
	return j, nil
}

// Close closes the files j holds.
func (j *Join) Close() {
	if j.Dir != nil {
		j.Dir.Close()
	}
	for _, f := range j.Tasks {
		f.Close()
	}
}

// Pids returns the pids in the sandbox's cgroups (deduplicated).
func Pids(dirs []string) []int {
	seen := map[int]bool{}
	var pids []int
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
				seen[pid] = true
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// OOMKills returns how many processes the kernel's OOM killer killed in the
// sandbox's memory cgroup: the "oom_kill" count of v2 memory.events or v1
// memory.oom_control (kernel 4.13+). ok is false when no cgroup has either
// counter.
func OOMKills(dirs []string) (n int64, ok bool) {
	for _, d := range dirs {
		for _, f := range []string{"memory.events", "memory.oom_control"} {
			if n, ok := readKeyed(filepath.Join(d, f), "oom_kill"); ok {
				return n, true
			}
		}
	}
	return 0, false
}

// KilledInSave adds to err, a checkpoint's failure, that the sandbox's
// memory cgroup OOM-killed some of its processes while it was saved, if
// its OOMKills count (in dirs) grew past before: a sentry killed
// mid-save leaves runsc only an EOF to say.
func KilledInSave(err error, dirs []string, before int64) error {
	if n, ok := OOMKills(dirs); ok && n > before {
		return fmt.Errorf("%w (the sandbox's memory cgroup OOM-killed %d of its processes: its memory limit was reached while it was saved, the room the save gets above it included)", err, n-before)
	}
	return err
}

// Failcnt returns the v1 memory.failcnt of the sandbox's memory cgroup: how
// often usage hit the limit. It is a rough stand-in for OOMKills on kernels
// older than 4.13, where usage at the limit mostly ends in an OOM kill.
func Failcnt(dirs []string) int64 {
	for _, d := range dirs {
		if n, ok := readInt(filepath.Join(d, "memory.failcnt")); ok {
			return n
		}
	}
	return 0
}

// readKeyed reads the value of key from a "key value" per line cgroup file.
func readKeyed(path, key string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, " ")
		if ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// KillAndRemove SIGKILLs every process left in dirs (a launcher or nsenter
// that has not exited yet), then removes them.
func KillAndRemove(dirs []string) error {
	for _, p := range Pids(dirs) {
		syscall.Kill(p, syscall.SIGKILL)
	}
	return Remove(dirs)
}

// Remove removes the sandbox's cgroup directories. The kernel refuses
// (EBUSY) while a just-killed process is still being torn down, so it
// retries for up to two seconds.
func Remove(dirs []string) error {
	var errs []error
	for _, d := range dirs {
		var err error
		for try := 0; try < 200; try++ {
			err = os.Remove(d)
			if err == nil || errors.Is(err, os.ErrNotExist) {
				err = nil
				break
			}
			if !errors.Is(err, syscall.EBUSY) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}
