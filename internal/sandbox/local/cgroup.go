//go:build linux

package local

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

// cgroupPeriodUs is the CFS period for CPU limits: 100 ms, the kernel default,
// so a 500-millicore limit is 50 ms of CPU every 100 ms.
const cgroupPeriodUs = 100000

// cgroupV1Controllers are the v1 hierarchies a sandbox gets a cgroup in.
var cgroupV1Controllers = []string{"memory", "pids", "cpu"}

// cgroups creates and removes per-sandbox cgroups under one parent, on either
// cgroup v1 (one hierarchy per controller) or v2 (one unified hierarchy).
// It holds no mutable state and is safe for concurrent use.
type cgroups struct {
	root   string // cgroupfs mount point, e.g. /sys/fs/cgroup
	parent string // relative path of the parent cgroup, e.g. "corral"
	v2     bool
}

// detectCgroups inspects root: v2 if root/cgroup.controllers exists, else v1
// hierarchies root/{memory,pids,cpu}.
func detectCgroups(root, parent string) (*cgroups, error) {
	parent = filepath.Clean(parent)
	if parent == "." || filepath.IsAbs(parent) || !filepath.IsLocal(parent) {
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

// version returns "v1" or "v2".
func (c *cgroups) version() string {
	if c.v2 {
		return "v2"
	}
	return "v1"
}

// prepare creates the parent cgroup(s) and, on v2, enables the memory, pids
// and cpu controllers for its children. It proves the hierarchy is writable.
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
	// Every cgroup from the root down to the parent must delegate the
	// controllers to its children: root -> corral -> corral/<id>.
	dir := c.root
	for _, elem := range append([]string{""}, strings.Split(c.parent, string(filepath.Separator))...) {
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
	if err := writeCgroupFile(ctlFile, strings.Join(add, " ")); err != nil {
		return err
	}
	return nil
}

// create makes the sandbox's cgroup(s) for id and writes its limits. It
// returns the cgroup directories (absolute), which the caller persists.
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
	if c.v2 {
		err = writeLimitsV2(dirs[0], lim)
	} else {
		err = writeLimitsV1(dirs[0], dirs[1], dirs[2], lim)
	}
	if err != nil {
		return nil, err
	}
	return dirs, nil
}

func writeLimitsV2(dir string, lim sandbox.Limits) error {
	if lim.MemoryBytes > 0 {
		if err := writeCgroupFile(filepath.Join(dir, "memory.max"), strconv.FormatInt(lim.MemoryBytes, 10)); err != nil {
			return err
		}
		// Without swap.max=0 a memory-limited sandbox swaps instead of
		// being OOM-killed. The file exists only with swap accounting.
		if err := writeIfExists(filepath.Join(dir, "memory.swap.max"), "0"); err != nil {
			return err
		}
	}
	if lim.Pids > 0 {
		if err := writeCgroupFile(filepath.Join(dir, "pids.max"), strconv.FormatInt(lim.Pids, 10)); err != nil {
			return err
		}
	}
	if lim.CPUMillis > 0 {
		quota := lim.CPUMillis * cgroupPeriodUs / 1000
		if err := writeCgroupFile(filepath.Join(dir, "cpu.max"), fmt.Sprintf("%d %d", quota, cgroupPeriodUs)); err != nil {
			return err
		}
	}
	return nil
}

func writeLimitsV1(memDir, pidsDir, cpuDir string, lim sandbox.Limits) error {
	if lim.MemoryBytes > 0 {
		v := strconv.FormatInt(lim.MemoryBytes, 10)
		if err := writeCgroupFile(filepath.Join(memDir, "memory.limit_in_bytes"), v); err != nil {
			return err
		}
		// memsw (memory+swap) must be >= limit_in_bytes, so it is written
		// second; equal values forbid swap. It exists only with swapaccount.
		if err := writeIfExists(filepath.Join(memDir, "memory.memsw.limit_in_bytes"), v); err != nil {
			return err
		}
	}
	if lim.Pids > 0 {
		if err := writeCgroupFile(filepath.Join(pidsDir, "pids.max"), strconv.FormatInt(lim.Pids, 10)); err != nil {
			return err
		}
	}
	if lim.CPUMillis > 0 {
		if err := writeCgroupFile(filepath.Join(cpuDir, "cpu.cfs_period_us"), strconv.Itoa(cgroupPeriodUs)); err != nil {
			return err
		}
		quota := lim.CPUMillis * cgroupPeriodUs / 1000
		if err := writeCgroupFile(filepath.Join(cpuDir, "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10)); err != nil {
			return err
		}
	}
	return nil
}

// writeCgroupFile writes one value. cgroupfs files exist already; in a fake
// cgroupfs (tests) the file is created.
func writeCgroupFile(path, value string) error {
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		return fmt.Errorf("write cgroup file %s: %w", path, err)
	}
	return nil
}

func writeIfExists(path, value string) error {
	if _, err := os.Stat(path); err != nil {
		return nil
	}
	return writeCgroupFile(path, value)
}

// procsFiles returns the cgroup.procs file of each directory, for the
// launcher to write its own pid into.
func procsFiles(dirs []string) []string {
	out := make([]string, len(dirs))
	for i, d := range dirs {
		out[i] = filepath.Join(d, "cgroup.procs")
	}
	return out
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
// sandbox's memory cgroup: v2 memory.events "oom_kill", v1
// memory.oom_control "oom_kill" (kernel 4.13+), else v1 memory.failcnt.
func oomKilled(dirs []string) bool {
	for _, d := range dirs {
		if n, ok := readKeyed(filepath.Join(d, "memory.events"), "oom_kill"); ok {
			return n > 0
		}
		if n, ok := readKeyed(filepath.Join(d, "memory.oom_control"), "oom_kill"); ok {
			return n > 0
		}
		if b, err := os.ReadFile(filepath.Join(d, "memory.failcnt")); err == nil {
			n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			return n > 0
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
// retries for up to a second.
func removeCgroups(dirs []string) error {
	var errs []error
	for _, d := range dirs {
		var err error
		for try := 0; try < 100; try++ {
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
