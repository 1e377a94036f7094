//go:build integration

package e2e_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
)

// BenchmarkWarmIdleMemory measures what an idle warm sandbox costs in
// memory: a server keeps CORRAL_BENCH_WARM sandboxes warm (default 1000,
// half of each shape), and the proportional set size (PSS) of every
// process in their cgroups (the launcher, bwrap's two, the waiting
// worker) is summed and divided by their number. Beside it, in the same
// run, the same number of bare idle bwrap sandboxes
// (bwrap --unshare-all ... /bin/sleep), their processes summed the same
// way. It ignores b.N: one fill is the measurement.
func BenchmarkWarmIdleMemory(b *testing.B) {
	n := 1000
	if v := os.Getenv("CORRAL_BENCH_WARM"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 2 {
			b.Fatalf("CORRAL_BENCH_WARM=%q: want a number of sandboxes, at least 2", v)
		}
	}
	s := startServer(b, []string{}, nil, func(c *config.Config) { c.Local.WarmPool = n / 2; c.Local.WarmIdle = 0 })
	t0 := time.Now()
	var ids []string
	for deadline := time.Now().Add(20 * time.Minute); ; time.Sleep(time.Second) {
		ids = warmIDs(b, s.data)
		if len(ids) >= n/2*2 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d warm sandboxes after 20 minutes", len(ids), n)
		}
	}
	fill := time.Since(t0)
	time.Sleep(2 * time.Second) // the last ones' worker past its start
	byCgroup := pssByCgroup(b)
	var warmKiB, procs int
	for _, id := range ids {
		c, ok := byCgroup[id]
		if !ok {
			b.Fatalf("no process in the cgroup of warm sandbox %s", id)
		}
		warmKiB += c.kib
		procs += c.procs
	}

	// The same number of bare idle sandboxes.
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		b.Fatal(err)
	}
	var bare []*exec.Cmd
	b.Cleanup(func() {
		for _, c := range bare {
			c.Process.Kill()
			c.Wait()
		}
	})
	args := append([]string{"--unshare-all", "--die-with-parent", "--ro-bind", "/usr", "/usr"}, rootLinks()...)
	args = append(args, "--proc", "/proc", "--dev", "/dev", "/bin/sleep", "3600")
	for range len(ids) {
		c := exec.Command(bwrap, args...)
		if err := c.Start(); err != nil {
			b.Fatal(err)
		}
		bare = append(bare, c)
	}
	time.Sleep(2 * time.Second)
	var bareKiB int
	for _, c := range bare {
		bareKiB += treePSS(b, c.Process.Pid)
	}
	per := float64(warmKiB) / float64(len(ids)) / 1024
	perBare := float64(bareKiB) / float64(len(bare)) / 1024
	b.ReportMetric(per, "MiB-PSS/warm-sandbox")
	b.ReportMetric(perBare, "MiB-PSS/bare-bwrap")
	b.ReportMetric(float64(len(ids)), "sandboxes")
	b.Logf("%d warm sandboxes (%d processes) filled in %s: %.2f MiB PSS each; %d bare idle bwrap sandboxes: %.2f MiB each; ratio %.1f",
		len(ids), procs, fill.Round(time.Second), per, len(bare), perBare, per/perBare)
}

// rootLinks are bwrap's arguments for /bin, /lib and /lib64 as on a
// merged-/usr host.
func rootLinks() []string {
	var args []string
	for _, d := range []string{"/bin", "/sbin", "/lib", "/lib64"} {
		if t, err := os.Readlink(d); err == nil {
			args = append(args, "--symlink", t, d)
		}
	}
	return args
}

type cgroupPSS struct{ kib, procs int }

// pssByCgroup sums the PSS of every process by the last element of its
// memory cgroup's path (v1) or its unified cgroup (v2).
func pssByCgroup(tb testing.TB) map[string]cgroupPSS {
	out := map[string]cgroupPSS{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		name := memoryCgroup(pid)
		if name == "" {
			continue
		}
		c := out[name]
		c.kib += pss(pid)
		c.procs++
		out[name] = c
	}
	return out
}

func memoryCgroup(pid int) string {
	f, err := os.Open(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var unified string
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "memory" {
			return filepath.Base(parts[2])
		}
		if parts[1] == "" {
			unified = filepath.Base(parts[2])
		}
	}
	return unified
}

// pss is a process's Pss in KiB, 0 if it is gone.
func pss(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Pss:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return n
		}
	}
	return 0
}

// treePSS is the PSS in KiB of pid and all its descendants.
func treePSS(tb testing.TB, pid int) int {
	total := pss(pid)
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	for _, f := range strings.Fields(string(b)) {
		if c, err := strconv.Atoi(f); err == nil {
			total += treePSS(tb, c)
		}
	}
	return total
}
