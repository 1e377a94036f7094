package worker

import (
	"strings"
	"syscall"
	"testing"
)

func TestMemoryCgroupDir(t *testing.T) {
	const id = "/docker/3535cc42"
	tests := []struct {
		name, cgroup, mountinfo string
		dir, file               string // "" for none
	}{{
		name:      "docker on v1: its own cgroup mounted read-only",
		cgroup:    "8:pids:" + id + "\n4:memory:" + id + "\n0::" + id + "\n",
		mountinfo: "77 76 0:46 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n81 77 0:32 " + id + " /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n85 77 0:36 " + id + " /sys/fs/cgroup/pids ro - cgroup cgroup rw,pids\n",
		dir:       "/sys/fs/cgroup/memory", file: "memory.oom_control",
	}, {
		name:      "a local sandbox on v1: the host's hierarchy",
		cgroup:    "4:memory:/corral/task-1\n1:cpu,cpuacct:/corral/task-1\n",
		mountinfo: "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
		dir:       "/sys/fs/cgroup/memory/corral/task-1", file: "memory.oom_control",
	}, {
		name:      "v2 in its own cgroup namespace",
		cgroup:    "0::/\n",
		mountinfo: "30 29 0:26 / /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n",
		dir:       "/sys/fs/cgroup", file: "memory.events",
	}, {
		name:      "v2 under a host's hierarchy",
		cgroup:    "0::/corral/task-1\n",
		mountinfo: "30 29 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
		dir:       "/sys/fs/cgroup/corral/task-1", file: "memory.events",
	}, {
		name:      "v1's memory hierarchy wins over the unified one, which has no memory controller",
		cgroup:    "4:memory:/a\n0::/a\n",
		mountinfo: "30 29 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n",
		dir:       "/sys/fs/cgroup/memory/a", file: "memory.oom_control",
	}, {
		name:      "a cgroup outside the mount's root",
		cgroup:    "4:memory:/other\n",
		mountinfo: "81 77 0:32 " + id + " /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n",
	}, {
		name:      "a cgroup outside its namespace",
		cgroup:    "0::/../sibling\n",
		mountinfo: "30 29 0:26 / /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n",
	}, {
		name:      "a prefix of another's name is not its parent",
		cgroup:    "4:memory:/docker/3535cc42x\n",
		mountinfo: "81 77 0:32 " + id + " /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n",
	}, {
		name:      "no cgroup file system mounted",
		cgroup:    "4:memory:/a\n",
		mountinfo: "20 1 0:5 / /proc rw - proc proc rw\n",
	}, {
		name:      "torn lines",
		cgroup:    "4:memory\n::\n",
		mountinfo: "81 77 0:32 / /sys/fs/cgroup/memory\n - cgroup\n",
	}}
	for _, tt := range tests {
		dir, file, ok := memoryCgroupDir(tt.cgroup, tt.mountinfo)
		if dir != tt.dir || file != tt.file || ok != (tt.dir != "") {
			t.Errorf("%s: memoryCgroupDir = %q, %q, %v; want %q, %q", tt.name, dir, file, ok, tt.dir, tt.file)
		}
	}
}

func TestErrorMessageSaysOutOfMemory(t *testing.T) {
	got := errorMessage(137, syscall.SIGKILL, false, 2, "", "Killed\n")
	want := "exit code 137 (signal: killed), out of memory: the sandbox's memory cgroup OOM-killed 2 of its processes: Killed"
	if got != want {
		t.Errorf("errorMessage = %q, want %q", got, want)
	}
	if got := errorMessage(137, syscall.SIGKILL, false, 0, "", ""); strings.Contains(got, "memory") {
		t.Errorf("errorMessage without OOM kills = %q", got)
	}
}
