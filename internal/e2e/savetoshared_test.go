//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// manyFiles is a command-agent script writing n small files to output/.
func manyFiles(n int) []string {
	return []string{"sh", "-c", `cd output && i=0; while [ $i -lt ` + strconv.Itoa(n) + ` ]; do echo "file $i" > "f$i.txt"; i=$((i+1)); done`}
}

// waitSaved waits until task id's save_to_shared copy is recorded (the
// task's shared_outputs leaves "pending") and returns the copy's event.
func waitSaved(t testing.TB, c *httpapi.Client, id string, within time.Duration) eventstore.Event {
	t.Helper()
	ctx := context.Background()
	for deadline := time.Now().Add(within); ; time.Sleep(50 * time.Millisecond) {
		tk, err := c.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if tk.SharedOutputs == nil {
			t.Fatalf("task %s (%s) has no shared_outputs: it did not ask save_to_shared, or did not succeed", id, tk.Status)
		}
		if tk.SharedOutputs.State != task.SavePending {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s: its outputs are still pending after %s", id, within)
		}
	}
	var saved []eventstore.Event
	if err := c.Events(ctx, service.EventsRequest{TaskID: id}, func(e eventstore.Event) error {
		if e.Type == task.EventOutputsSaved || e.Type == task.EventOutputsSaveFailed {
			saved = append(saved, e)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(saved) != 1 {
		t.Fatalf("task %s has %d outputs_saved or outputs_save_failed events, want 1", id, len(saved))
	}
	return saved[0]
}

// (s *server) waitSaved is waitSaved on the test's server, decoding the
// event's payload.
func (s *server) waitSaved(t testing.TB, id string) task.OutputsSaved {
	t.Helper()
	e := waitSaved(t, s.client, id, 2*time.Minute)
	var p task.OutputsSaved
	if err := json.Unmarshal(e.Data, &p); err != nil {
		t.Fatal(err)
	}
	if e.Type != task.EventOutputsSaved {
		t.Fatalf("task %s: %s: %s", id, e.Type, p.Error)
	}
	return p
}

// positions returns the store position of the first event of each type on
// task id's stream.
func positions(t testing.TB, c *httpapi.Client, id string) map[string]int64 {
	t.Helper()
	pos := map[string]int64{}
	if err := c.Events(context.Background(), service.EventsRequest{TaskID: id}, func(e eventstore.Event) error {
		if _, ok := pos[e.Type]; !ok {
			pos[e.Type] = e.Position
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return pos
}

// countFiles counts the regular files beneath dir, and the temporary files
// of interrupted writes among them.
func countFiles(dir string) (files, temporary int) {
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			files++
			if strings.HasPrefix(d.Name(), ".corral-tmp-") {
				temporary++
			}
		}
		return nil
	})
	return files, temporary
}

// TestSaveToSharedFollowsTheEnd (issue 33, finding 5): a task that writes
// 20,000 small files with save_to_shared ends when its worker ends, not
// when the copy does: its worker_completed comes before outputs_saved, and
// with one worker slot a second task starts before the copy is recorded.
// The outputs arrive, recorded once; the task said "pending" until then.
func TestSaveToSharedFollowsTheEnd(t *testing.T) {
	t.Parallel()
	s := MustStart(t, func(c *config.Config) { c.AIWorker.MaxConcurrentWorkers = 1 })
	ctx := context.Background()
	const n = 20000
	many := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "many small files", Agent: "command", Command: manyFiles(n), SaveToShared: true})
	next := s.spawn(t, "the next task", "sh", "-c", "echo next > output/next.txt")
	res := s.waitSuccess(t, many.ID, 3*time.Minute)
	if res.SharedOutputs == nil {
		t.Fatalf("the ended task's result has no shared_outputs")
	}
	s.waitSuccess(t, next.ID, 3*time.Minute)
	saved := s.waitSaved(t, many.ID)

	pm, pn := positions(t, s.client, many.ID), positions(t, s.client, next.ID)
	end, copied := pm[task.EventCompleted], pm[task.EventOutputsSaved]
	if end == 0 || copied == 0 || end > copied {
		t.Errorf("worker_completed at %d, outputs_saved at %d: want the end first", end, copied)
	}
	// One slot: the next task waited for the end of the first, and not for
	// its copy.
	if starting := pn[task.EventStarting]; starting < end || starting > copied {
		t.Errorf("the next task claimed the slot at %d; the first ended at %d, its copy was recorded at %d: want between the two", starting, end, copied)
	}
	if started := pn[task.EventStarted]; started > copied {
		t.Errorf("the next task started at %d, after the first task's copy (%d)", started, copied)
	}

	month := res.CompletedAt.UTC().Format("2006-01")
	dir := filepath.Join(s.data, "shared", "outputs", month, many.ID)
	if got, tmp := countFiles(dir); got != n || tmp != 0 {
		t.Errorf("%s holds %d files (%d temporary), want %d", dir, got, tmp, n)
	}
	if saved.Directory != "shared/outputs/"+month+"/"+many.ID || saved.FilesTotal != n || len(saved.Files) != task.MaxSavedListed {
		t.Errorf("outputs_saved: %s, %d files listed of %d; want %d listed of %d", saved.Directory, len(saved.Files), saved.FilesTotal, task.MaxSavedListed, n)
	}
	got, err := s.client.Get(ctx, many.ID)
	if err != nil || got.SharedOutputs == nil || got.SharedOutputs.State != task.SaveSaved || got.SharedOutputs.Directory != saved.Directory {
		t.Errorf("the task after its copy: %+v %v", got.SharedOutputs, err)
	}
}

// TestSaveToSharedAfterKill9: the server is killed with SIGKILL while it
// copies a task's outputs, after the task's end was recorded; the next
// server copies them again from nothing and records the copy once.
func TestSaveToSharedAfterKill9(t *testing.T) {
	t.Parallel()
	data, srv := startKillable(t)
	ctx := context.Background()
	const n = 20000
	tk := mustSpawn(t, srv.client, service.SpawnRequest{TaskDescription: "many small files", Agent: "command", Command: manyFiles(n), SaveToShared: true})
	res, err := srv.client.Result(ctx, service.ResultRequest{TaskID: tk.ID, Wait: 3 * time.Minute})
	if err != nil || !res.Done || res.Status != task.Success {
		t.Fatalf("task: %v %s %s", err, res.Status, res.ErrorMessage)
	}
	dir := filepath.Join(data, "shared", "outputs", res.CompletedAt.UTC().Format("2006-01"), tk.ID)
	// Stop the server in the middle of the copy: once some files are
	// there, and (stopped, it can do nothing more) not all of them.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Millisecond) {
		if got, _ := countFiles(dir); got > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the copy never began in %s", dir)
		}
	}
	if err := srv.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	copied, _ := countFiles(dir)
	srv.kill()
	if copied >= n {
		t.Fatalf("the copy was done (%d files) before the server could be stopped: nothing was interrupted", copied)
	}
	t.Logf("killed with %d of %d files copied", copied, n)

	srv = startProcess(t, data)
	e := waitSaved(t, srv.client, tk.ID, 3*time.Minute)
	var saved task.OutputsSaved
	json.Unmarshal(e.Data, &saved)
	if e.Type != task.EventOutputsSaved || saved.FilesTotal != n {
		t.Fatalf("after the restart: %s, %d files (%s)", e.Type, saved.FilesTotal, saved.Error)
	}
	// Recorded by the new server, after its start-up reconciliation.
	var reconciled int64
	if err := srv.client.Events(ctx, service.EventsRequest{}, func(ev eventstore.Event) error {
		if ev.Type == task.EventReconciled {
			reconciled = ev.Position
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if e.Position < reconciled {
		t.Errorf("outputs_saved at %d, before the restart's reconciliation at %d", e.Position, reconciled)
	}
	if got, tmp := countFiles(dir); got != n || tmp != 0 {
		t.Errorf("%s holds %d files (%d temporary), want %d", dir, got, tmp, n)
	}
	// Once: another restart copies nothing again.
	srv.kill()
	srv = startProcess(t, data)
	if tk, err := srv.client.Get(ctx, tk.ID); err != nil || tk.SharedOutputs == nil || tk.SharedOutputs.State != task.SaveSaved {
		t.Fatalf("after a second restart: %+v %v", tk.SharedOutputs, err)
	}
	time.Sleep(time.Second) // time for a wrong second copy to be recorded
	waitSaved(t, srv.client, tk.ID, time.Minute)
}
