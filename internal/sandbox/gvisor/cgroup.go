//go:build linux

package gvisor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
)

// cgroupPeriodUs is the CFS period for CPU limits: 100 ms, the kernel
// default, so a 500-millicore limit is 50 ms of CPU every 100 ms.
const cgroupPeriodUs = 100000

// cgroupV1Controllers are the v1 hierarchies a sandbox gets a cgroup in.
// runsc creates the sandbox's cgroups in the other hierarchies itself.
var cgroupV1Controllers = []string{"memory", "pids", "cpu"}

// cgroups creates and removes per-sandbox cgroups under one parent, on
// cgroup v1 (one hierarchy per controller) or v2 (the unified hierarchy).
// It holds no mutable state and is safe for concurrent use.
type cgroups struct {
	root   string // cgroupfs mount point, e.g. /sys/fs/cgroup
	parent string // relative path of the parent cgroup, e.g. "corral-gvisor"
	v2     bool
}

// detectCgroups inspects root: v2 if root/cgroup.controllers exists, else v1
// hierarchies root/{memory,pids,cpu}.
func detectCgroups(root, parent string) (*cgroups, error) {
	parent = filepath.Clean(parent)
	if parent == "." || !filepath.IsLocal(parent) {
		return nil, fmt.Errorf("cgroup parent %q: must be a relative path: %w", parent, errdefs.ErrInvalidArgument)
	}
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err == nil {
		return &cgroups{root: root, parent: parent, v2: true}, nil
	}
	for _, c := range cgroupV1Controllers {
		if _, err := os.Stat(filepath.Join(root, c, "cgroup.procs")); err != nil {
			return nil, fmt.Errorf("find cgroup v1 %s hierarchy under %s: %w", c, root, errdefs.ErrUnavailable)
		}
	}
	return &cgroups{root: root, parent: parent}, nil
}

// prepare creates the parent cgroup(s) and, on v2, enables the memory,
// pids and cpu controllers from the root down to the parent's children.
// It proves the hierarchy is writable.
func (c *cgroups) prepare() error {
	if !c.v2 {
		for _, ctl := range cgroupV1Controllers {
			if err := os.MkdirAll(filepath.Join(c.root, ctl, c.parent), 0o755); err != nil {
				return fmt.Errorf("create cgroup %s/%s: %w", ctl, c.parent, err)
			}
		}
		return nil
	}
	if err := os.MkdirAll(filepath.Join(c.root, c.parent), 0o755); err != nil {
		return fmt.Errorf("create cgroup %s: %w", c.parent, err)
	}
	dir := c.root
	for _, elem := range append([]string{""}, strings.Split(c.parent, string(filepath.Separator))...) {
		dir = filepath.Join(dir, elem)
		ctlFile := filepath.Join(dir, "cgroup.subtree_control")
		cur, err := os.ReadFile(ctlFile)
		if err != nil {
			return fmt.Errorf("read %s: %w", ctlFile, err)
		}
		var add []string
		for _, want := range []string{"memory", "pids", "cpu"} {
			if !strings.Contains(" "+strings.TrimSpace(string(cur))+" ", " "+want+" ") {
				add = append(add, "+"+want)
			}
		}
		if len(add) > 0 {
			if err := writeCgroupFile(ctlFile, strings.Join(add, " ")); err != nil {
				return err
			}
		}
	}
	return nil
}

// create makes the sandbox's cgroup(s) for id with the limits lim and
// returns their absolute directories, which the caller persists.
func (c *cgroups) create(id string, lim sandbox.Limits) (dirs []string, err error) {
	if c.v2 {
		dirs = []string{filepath.Join(c.root, c.parent, id)}
	} else {
		for _, ctl := range cgroupV1Controllers {
			dirs = append(dirs, filepath.Join(c.root, ctl, c.parent, id))
		}
	}
	for _, d := range dirs {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("create cgroup %s: %w", d, err)
		}
	}
	defer func() {
		if err != nil {
			removeCgroups(dirs)
		}
	}()
	mem, pids, cpu := dirs[0], dirs[0], dirs[0]
	memFile, memswFile, cpuFile := "memory.max", "memory.swap.max", "cpu.max"
	if !c.v2 {
		mem, pids, cpu = dirs[0], dirs[1], dirs[2]
		memFile, memswFile = "memory.limit_in_bytes", "memory.memsw.limit_in_bytes"
	}
	if lim.MemoryBytes > 0 {
		v := strconv.FormatInt(lim.MemoryBytes, 10)
		if err := writeCgroupFile(filepath.Join(mem, memFile), v); err != nil {
			return nil, err
		}
		// No swap: a sandbox over its limit is OOM-killed, not swapped
		// out (v2 swap.max 0; v1 memsw equal to the limit, written second
		// because it must not be below it). The files exist only with
		// swap accounting.
		swap := "0"
		if !c.v2 {
			swap = v
		}
		if _, err := os.Stat(filepath.Join(mem, memswFile)); err == nil {
			if err := writeCgroupFile(filepath.Join(mem, memswFile), swap); err != nil {
				return nil, err
			}
		}
	}
	if lim.Pids > 0 {
		if err := writeCgroupFile(filepath.Join(pids, "pids.max"), strconv.FormatInt(lim.Pids, 10)); err != nil {
			return nil, err
		}
	}
	if lim.CPUMillis > 0 {
		quota := lim.CPUMillis * cgroupPeriodUs / 1000
		if c.v2 {
			err = writeCgroupFile(filepath.Join(cpu, cpuFile), fmt.Sprintf("%d %d", quota, cgroupPeriodUs))
		} else if err = writeCgroupFile(filepath.Join(cpu, "cpu.cfs_period_us"), strconv.Itoa(cgroupPeriodUs)); err == nil {
			err = writeCgroupFile(filepath.Join(cpu, "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10))
		}
		if err != nil {
			return nil, err
		}
	}
	return dirs, nil
}

func writeCgroupFile(path, value string) error {
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		return fmt.Errorf("write cgroup file %s: %w", path, err)
	}
	return nil
}

// cgroupPids returns the pids in the sandbox's cgroups (deduplicated).
func cgroupPids(dirs []string) []int {
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

// oomKilled reports whether the kernel's OOM killer killed a process in the
// sandbox's memory cgroup: the "oom_kill" count of v2 memory.events or v1
// memory.oom_control (kernel 4.13+).
func oomKilled(dirs []string) bool {
	for _, d := range dirs {
		for _, f := range []string{"memory.events", "memory.oom_control"} {
			if n, ok := readKeyed(filepath.Join(d, f), "oom_kill"); ok {
				return n > 0
			}
		}
	}
	return false
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

// removeCgroups removes the sandbox's cgroup directories. The kernel refuses
// (EBUSY) while a just-killed process is still being torn down, so it
// retries for up to two seconds.
func removeCgroups(dirs []string) error {
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
