package worker

import (
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
)

// ownOOMKills is how many processes the kernel's OOM killer has killed in
// the memory cgroup the worker runs in, read through the cgroup file
// system as the sandbox has it mounted (a container's own cgroup, or the
// host's hierarchy in a local sandbox). 0 where none can be read: no
// cgroup file system, gVisor's own, a kernel before 4.13.
//
// A sandbox serves one task, so a kill counted there is this task's. The
// runtime may know it too, but not always: the Docker engine learns an
// OOM kill from containerd's shim, which drops it when the container's
// cgroup is gone by the time it reads the kernel's notice (a busy host).
func ownOOMKills() int64 {
	cg, err1 := os.ReadFile("/proc/self/cgroup")
	mi, err2 := os.ReadFile("/proc/self/mountinfo")
	if err1 != nil || err2 != nil {
		return 0
	}
	dir, file, ok := memoryCgroupDir(string(cg), string(mi))
	if !ok {
		return 0
	}
	b, err := os.ReadFile(path.Join(dir, file))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return max(n, 0)
		}
	}
	return 0
}

// memoryCgroupDir finds, from a process's /proc/self/cgroup and
// /proc/self/mountinfo, the directory of its memory cgroup and the file
// that counts its OOM kills: memory.oom_control in a v1 memory hierarchy,
// else memory.events in the v2 one. The cgroup's path is taken relative
// to the mount's root: a container's v1 hierarchy is its own cgroup
// mounted at /sys/fs/cgroup/memory.
func memoryCgroupDir(cgroup, mountinfo string) (dir, file string, ok bool) {
	var v1, v2 string // the cgroup's path in each hierarchy; "" for none (a path starts with /)
	for line := range strings.SplitSeq(cgroup, "\n") {
		f := strings.SplitN(line, ":", 3)
		switch {
		case len(f) != 3:
		case f[0] == "0" && f[1] == "":
			v2 = f[2]
		case slices.Contains(strings.Split(f[1], ","), "memory"):
			v1 = f[2]
		}
	}
	for line := range strings.SplitSeq(mountinfo, "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 {
			continue
		}
		root, point := f[3], f[4]
		switch {
		case v1 != "" && g[0] == "cgroup" && slices.Contains(strings.Split(g[2], ","), "memory"):
			if d, ok := within(point, root, v1); ok {
				return d, "memory.oom_control", true
			}
		case v2 != "" && v1 == "" && g[0] == "cgroup2":
			if d, ok := within(point, root, v2); ok {
				return d, "memory.events", true
			}
		}
	}
	return "", "", false
}

// within is where cgroup p is under a mount at point of its hierarchy's
// root: false for a cgroup outside the mount's root.
func within(point, root, p string) (string, bool) {
	if strings.Contains(point, `\`) || strings.Contains(p, "/..") {
		return "", false // an escaped name, or a cgroup outside the namespace's
	}
	if root == "/" {
		return path.Join(point, p), true
	}
	if p == root {
		return point, true
	}
	if rel, ok := strings.CutPrefix(p, root+"/"); ok {
		return path.Join(point, rel), true
	}
	return "", false
}
