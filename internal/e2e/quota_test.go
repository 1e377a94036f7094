//go:build integration

package e2e_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/quota"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
	"github.com/corral-dev/corral/internal/units"
)

// fillerQuota is the task directory quota the fillers run against.
const fillerQuota = 64 << 20

// fastFiller writes 1 MiB files into output/ as fast as the disk takes
// them, from one process, until something stops it.
var fastFiller = []string{"split", "-b", "1048576", "-a", "6", "/dev/zero", "output/f"}

// TestQuotaStopsFastFiller: a filler writing as fast as the disk takes it
// on a file system without project quotas is stopped by the poll: the task
// fails with the quota error, its sandbox is gone, and nothing grows after.
// How far past the quota it got depends on the machine's speed and load,
// so it is logged here and measured by BenchmarkQuotaOvershoot, not
// asserted.
func TestQuotaStopsFastFiller(t *testing.T) {
	s := MustStart(t, withFillerQuota)
	u := fillPastQuota(t, s)
	t.Logf("fast filler against a %s polled quota: %s written in %d files (%.2f× the quota)",
		units.FormatSize(fillerQuota), units.FormatSize(u.bytes), u.files, float64(u.bytes)/fillerQuota)
}

// BenchmarkQuotaOvershoot reports how far past a 64 MiB polled quota a
// fast filler gets, as a multiple of the quota (the poll every 2 s that
// came before let 11× through).
func BenchmarkQuotaOvershoot(b *testing.B) {
	s := startServer(b, []string{}, nil, withFillerQuota)
	var worst float64
	for b.Loop() {
		u := fillPastQuota(b, s)
		worst = max(worst, float64(u.bytes)/fillerQuota)
	}
	b.ReportMetric(worst, "x-quota-worst")
}

// fillPastQuota runs the fast filler to its end and returns what its task
// directory holds once the sandbox is gone (and stays: measured twice).
func fillPastQuota(tb testing.TB, s *server) dirUsage {
	tb.Helper()
	tk := mustSpawn(tb, s.client, service.SpawnRequest{TaskDescription: "fill the disk fast", Agent: "command", Command: fastFiller})
	s.waitOverQuota(tb, tk.ID)
	waitSandboxGone(tb, s, tk.ID, 20*time.Second)
	u := taskDirUsage(tb, s, tk.ID)
	time.Sleep(200 * time.Millisecond)
	if again := taskDirUsage(tb, s, tk.ID); again != u {
		tb.Errorf("the task directory grew after its sandbox was gone: %+v, then %+v", u, again)
	}
	return u
}

// TestQuotaHardWithProjectQuotas runs the filler on a data root that has
// project quotas (an ext4 image mounted with prjquota): the kernel stops
// it at the quota, to the block, and the task fails with the quota error.
func TestQuotaHardWithProjectQuotas(t *testing.T) {
	mnt, err := testenv.MountImage(t, 256<<20, "prjquota", "mkfs.ext4", "-q", "-O", "quota,project")
	if err != nil {
		// A kernel property, not an install step: skipped in CI too.
		t.Skipf("this kernel cannot mount ext4 with project quotas: %v", err)
	}
	if _, err := quota.Open(mnt); err != nil {
		t.Fatalf("ext4 mounted with prjquota: %v", err)
	}
	data := filepath.Join(mnt, "data")
	s := MustStart(t, func(c *config.Config) {
		withFillerQuota(c)
		c.Data = data
	})
	tk := s.spawn(t, "fill the disk with many files", "split", "-b", "262144", "-a", "6", "/dev/zero", "output/f")
	s.waitOverQuota(t, tk.ID)
	waitSandboxGone(t, s, tk.ID, 20*time.Second)
	u := taskDirUsage(t, s, tk.ID)
	dir, err := os.Open(filepath.Join(s.data, "tasks", tk.ID))
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	pu, lim, err := quota.Read(dir)
	if err != nil {
		t.Fatalf("the task directory's project: %v", err)
	}
	t.Logf("filler against a %s project quota: %s written in %d files, %s of blocks; the project holds %s in %d inodes",
		units.FormatSize(fillerQuota), units.FormatSize(u.bytes), u.files, units.FormatSize(u.blocks), units.FormatSize(pu.Bytes), pu.Inodes)
	if u.blocks > fillerQuota || pu.Bytes > fillerQuota {
		t.Errorf("the task directory holds %s of blocks (its project %s) against a %s quota", units.FormatSize(u.blocks), units.FormatSize(pu.Bytes), units.FormatSize(fillerQuota))
	}
	if lim != (quota.Limits{}) {
		t.Errorf("the project's limits %+v outlived the sandbox", lim)
	}
}

// withFillerQuota sets the task directory quota to fillerQuota.
func withFillerQuota(c *config.Config) {
	c.Limits.MaxTaskDirBytes, _ = config.ParseSize("64MiB")
	c.Limits.MaxContextBytes, _ = config.ParseSize("1MiB")
}

// waitOverQuota waits for task id to end, and checks that it failed with
// the output quota's error.
func (s *server) waitOverQuota(tb testing.TB, id string) {
	tb.Helper()
	res := s.wait(tb, id, 60*time.Second)
	if res.Status != task.Failed || !strings.HasPrefix(res.ErrorMessage, "output quota exceeded") {
		tb.Fatalf("status %s, error %q; want failed with output quota exceeded", res.Status, res.ErrorMessage)
	}
}

// waitSandboxGone waits for a task's local sandbox to be gone.
func waitSandboxGone(t testing.TB, s *server, id string, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(s.data, "run", "local", id)); os.IsNotExist(err) {
			return
		} else if time.Now().After(deadline) {
			t.Fatalf("the sandbox of %s still exists: %v", id, err)
		}
	}
}

// dirUsage is what a task directory holds: the sizes of its regular
// files, how many there are, and the blocks of everything in it.
type dirUsage struct {
	bytes, blocks int64
	files         int
}

func taskDirUsage(t testing.TB, s *server, id string) dirUsage {
	t.Helper()
	var u dirUsage
	err := filepath.WalkDir(filepath.Join(s.data, "tasks", id), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		u.blocks += info.Sys().(*syscall.Stat_t).Blocks * 512
		if d.Type().IsRegular() {
			u.bytes += info.Size()
			u.files++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return u
}
