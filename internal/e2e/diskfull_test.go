//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/session"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// mustSmallDisk mounts a tmpfs of size (e.g. "96m") for a data root and
// returns the path of the data root on it.
func mustSmallDisk(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small filesystem needs root")
	}
	mnt := testenv.TempDir(t)
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size="+size+",mode=0711"); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	return filepath.Join(mnt, "data")
}

// fill writes a file of zeros at path until the filesystem refuses, from
// a process of its own, as anything else on the host filling the disk
// would. (Written from this process, which is the server's, the file
// could outlive its removal for a moment: a child the server forks, a
// warm sandbox's launcher, holds a copy of its descriptor table until it
// executes.)
func fill(t *testing.T, path string) {
	t.Helper()
	out, err := exec.Command("dd", "if=/dev/zero", "of="+path, "bs=1M").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "No space left on device") {
		t.Fatalf("dd filling the disk: %v %s; want it stopped by a full disk", err, out)
	}
}

func (s *server) spawnRaw(t *testing.T, argv string) (int, string) {
	t.Helper()
	return s.do(t, http.MethodPost, "/api/tasks", "application/json",
		strings.NewReader(`{"task_description":"disk","agent":"command","command":["sh","-c",`+argv+`]}`))
}

// TestFreeSpaceFloor: a task filling the data root's disk is stopped at
// the free-space floor (or, faster than its polls, ends on the full disk),
// new work is refused with 507 naming the floor while the disk stays below
// it, and work is taken again by itself once space is freed.
func TestFreeSpaceFloor(t *testing.T) {
	t.Parallel()
	data := mustSmallDisk(t, "128m")
	s := MustStart(t, func(c *config.Config) {
		c.Data = data
		c.Limits.MinFreeDisk = mustSize(t, "48MiB")
		c.Limits.MaxTaskDirBytes = mustSize(t, "1GiB")
	})
	ctx := context.Background()
	made, err := s.client.CreateSession(ctx, session.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	filler := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "fill the disk", Agent: "command",
		Command: []string{"sh", "-c", "dd if=/dev/zero of=output/big bs=1M count=1000"}})
	// The floor is polled: a filler faster than the polls, on a busy
	// host, can fill the disk before one sees it. Then the server gives
	// back its event store's reserve and still records the filler's end.
	res := s.wait(t, filler.ID, 60*time.Second)
	atFloor := strings.Contains(res.ErrorMessage, "below limits.min_free_disk")
	if res.Status != task.Failed || !atFloor && !strings.Contains(res.ErrorMessage, "disk is full") {
		t.Fatalf("the disk filler ended %s: %q; want failed at the free-space floor, or on the full disk", res.Status, res.ErrorMessage)
	}
	if !atFloor {
		t.Logf("the disk filler filled the disk before a poll saw it pass the floor: %q", res.ErrorMessage)
	}

	code, body := s.spawnRaw(t, `"true"`)
	if code != http.StatusInsufficientStorage || !strings.Contains(body, "min_free_disk") {
		t.Fatalf("spawn below the floor: %d %s, want 507 naming the floor", code, body)
	}
	if _, err := s.client.WriteWorkspace(ctx, "notes.txt", []byte("x")); err == nil || !strings.Contains(err.Error(), "min_free_disk") {
		t.Errorf("write to shared/ below the floor: %v, want refused naming the floor", err)
	}
	// A session is new work too, and each fork a copy of its source's
	// files.
	if _, err := s.client.CreateSession(ctx, session.CreateRequest{}); !errors.Is(err, errdefs.ErrNoSpace) || !strings.Contains(err.Error(), "min_free_disk") {
		t.Errorf("a session made below the floor: %v, want refused naming the floor", err)
	}
	if _, err := s.client.Sessions().Fork(ctx, made.SessionID, 1); !errors.Is(err, errdefs.ErrNoSpace) || !strings.Contains(err.Error(), "min_free_disk") {
		t.Errorf("a fork below the floor: %v, want refused naming the floor", err)
	}

	if err := os.Remove(filepath.Join(data, "tasks", filler.ID, "output", "big")); err != nil {
		t.Fatal(err)
	}
	// The space comes back when the stopped sandbox has closed the file.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var st syscall.Statfs_t
		if err := syscall.Statfs(data, &st); err != nil {
			t.Fatal(err)
		}
		if int64(st.Bavail)*st.Bsize >= 48<<20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the disk stayed below the floor after the file was removed")
		}
	}
	tk := s.spawn(t, "after the space came back", "sh", "-c", "echo ok > output/ok.txt")
	if res := s.wait(t, tk.ID, 30*time.Second); res.Status != task.Success {
		t.Errorf("task after space was freed: %s %q, want success", res.Status, res.ErrorMessage)
	}
}

// TestDiskFull: with no floor, a disk filled to the last block makes
// spawns and writes fail with 507 "disk is full", not 500, and loses
// nothing: once space is freed the same server takes and runs tasks.
func TestDiskFull(t *testing.T) {
	t.Parallel()
	data := mustSmallDisk(t, "96m")
	s := MustStart(t, func(c *config.Config) {
		c.Data = data
		c.Limits.MinFreeDisk = config.Size{}
	})
	before := s.spawn(t, "before", "sh", "-c", "echo before > output/r.txt")
	s.wait(t, before.ID, 30*time.Second)

	// The server gives its event store's reserve back when a commit of
	// its own meets the full disk (a background one may, between the fill
	// and the spawn): the spawn then has room, and is taken. Filling what
	// the reserve gave back leaves it none.
	var fillers []string
	var accepted []string
	var code int
	var body string
	for attempt := range 3 {
		filler := filepath.Join(filepath.Dir(data), fmt.Sprintf("filler%d", attempt))
		fill(t, filler)
		fillers = append(fillers, filler)
		if code, body = s.spawnRaw(t, `"true"`); code != http.StatusCreated {
			break
		}
		var tk task.Task
		if err := json.Unmarshal([]byte(body), &tk); err != nil || tk.ID == "" {
			t.Fatalf("a spawn's answer: %v %s; want a task with its id", err, body)
		}
		accepted = append(accepted, tk.ID)
		t.Logf("a spawn found room the server made (its store's reserve): filling the disk again")
	}
	if code != http.StatusInsufficientStorage || !strings.Contains(body, "disk is full") {
		t.Errorf("spawn on a full disk: %d %s, want 507 saying the disk is full", code, body)
	}
	if strings.Contains(body, data) {
		t.Errorf("the error names host paths: %s", body)
	}

	for _, f := range fillers {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range accepted { // taken on a full disk: each ends (wait fails the test otherwise), never lost
		if res := s.wait(t, id, 30*time.Second); strings.HasPrefix(res.ErrorMessage, "lost") {
			t.Errorf("a task taken on the full disk ended %s: %s", res.Status, res.ErrorMessage)
		}
	}
	after := s.spawn(t, "after", "sh", "-c", "echo after > output/r.txt")
	if res := s.wait(t, after.ID, 30*time.Second, "r.txt"); res.Status != task.Success || res.FileContents["r.txt"].Content != "after\n" {
		t.Errorf("task after the disk was freed: %s %q", res.Status, res.ErrorMessage)
	}
	if tk, err := s.client.Get(context.Background(), before.ID); err != nil || tk.Status != task.Success {
		t.Errorf("the task from before the disk filled: %v %v", tk.Status, err)
	}
}
