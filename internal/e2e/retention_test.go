//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// clock is a test clock: the real time moved forward by hand.
type clock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.off += d
	c.mu.Unlock()
}

// Retention with the clock moved forward: old task directories go, a
// running task's stays, events remain; unused attachments go, one a
// running task names stays.
func TestRetention(t *testing.T) {
	clk := &clock{}
	s := startServer(t, []string{}, clk.Now, nil)
	ctx := context.Background()
	upload := func(name string) string {
		sent := false
		atts, err := s.client.UploadAttachments(ctx, func() (string, io.Reader, error) {
			if sent {
				return "", nil, io.EOF
			}
			sent = true
			return name, strings.NewReader("data of " + name), nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return atts[0].ID
	}
	unused, used := upload("unused.txt"), upload("used.txt")

	done := s.spawn(t, "quick", "sh", "-c", "echo hi > output/hi.txt")
	s.waitSuccess(t, done.ID, 30*time.Second)
	running := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "slow", Agent: "command", Command: []string{"sleep", "120"}, AttachmentIDs: []string{used}})
	s.waitStatus(t, running.ID, task.Running, 30*time.Second)
	eventsBefore := len(s.eventTypes(t, task.StreamID(done.ID)))

	// Nothing is old yet.
	rep, err := s.client.GC(ctx, service.GCRequest{})
	if err != nil || len(rep.TaskDirectories)+len(rep.Attachments) != 0 {
		t.Fatalf("fresh sweep: %+v %v, want nothing removed", rep, err)
	}

	clk.Advance(49 * time.Hour) // past task_retention_hours (48), not attachment_retention_hours (168)
	out := s.runCLI(t, "gc", "--server", s.url, "--dry-run", "--json")
	var dry service.GCReport
	if err := json.Unmarshal([]byte(out), &dry); err != nil {
		t.Fatalf("corral gc --dry-run --json: %v: %s", err, out)
	}
	if !dry.DryRun || len(dry.TaskDirectories) != 1 || dry.TaskDirectories[0].ID != done.ID || len(dry.Attachments) != 0 {
		t.Errorf("dry run %+v, want only %s", dry, done.ID)
	}
	if _, err := os.Stat(filepath.Join(s.data, "tasks", done.ID)); err != nil {
		t.Errorf("a dry run removed %s: %v", done.ID, err)
	}

	rep, err = s.client.GC(ctx, service.GCRequest{})
	if err != nil || len(rep.TaskDirectories) != 1 || rep.TaskDirectories[0].ID != done.ID {
		t.Fatalf("sweep %+v %v, want %s removed", rep, err, done.ID)
	}
	if _, err := os.Stat(filepath.Join(s.data, "tasks", done.ID)); !os.IsNotExist(err) {
		t.Errorf("ended task's directory still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.data, "tasks", running.ID)); err != nil {
		t.Errorf("running task's directory removed: %v", err)
	}
	types := s.eventTypes(t, task.StreamID(done.ID))
	if len(types) != eventsBefore+1 || types[len(types)-1] != task.EventDirectoryRemoved {
		t.Errorf("events of the removed task %v, want the %d before and task_directory_removed", types, eventsBefore)
	}
	if tk, err := s.client.Get(ctx, done.ID); err != nil || tk.Status != task.Success || len(tk.OutputFiles) != 1 {
		t.Errorf("the removed task is still known with its result: %+v %v", tk, err)
	}

	clk.Advance(200 * time.Hour)
	rep, err = s.client.GC(ctx, service.GCRequest{})
	if err != nil || len(rep.Attachments) != 1 || rep.Attachments[0].ID != unused || len(rep.TaskDirectories) != 0 {
		t.Fatalf("sweep %+v %v, want only attachment %s removed", rep, err, unused)
	}
	if _, _, err := s.client.OpenAttachment(ctx, unused); err == nil {
		t.Errorf("removed attachment still downloads")
	}
	if _, rc, err := s.client.OpenAttachment(ctx, used); err != nil {
		t.Errorf("attachment of a running task removed: %v", err)
	} else {
		rc.Close()
	}
	if types := s.eventTypes(t, task.AttachmentStreamID(unused)); len(types) != 2 || types[1] != task.EventAttachmentRemoved {
		t.Errorf("events of the removed attachment %v", types)
	}
	if _, err := s.client.Get(ctx, running.ID); err != nil {
		t.Fatal(err)
	}
	s.client.Cancel(ctx, running.ID)
}
