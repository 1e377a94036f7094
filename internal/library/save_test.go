package library

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/sqlite"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/projection/projectiontest"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workspace"
)

// fixture is a Library over a real SQLite store, its projection (followed
// as the server follows it) and a data root, in temporary directories.
type fixture struct {
	lib   *Library
	store *sqlite.Store
	tasks *projection.Tasks
	data  *workspace.DataRoot
	now   time.Time // the library's clock
}

func MustNew(tb testing.TB, edit func(*Options)) *fixture {
	tb.Helper()
	env := projectiontest.New(tb)
	env.Follow(tb)
	store, tasks, data := env.Store, env.Tasks, env.Data
	f := &fixture{store: store, tasks: tasks, data: data, now: time.Now()}
	opts := Options{Store: store, Tasks: tasks, Data: data, Limits: Limits{MaxTaskDirBytes: 1 << 20}, Now: func() time.Time { return f.now }}
	if edit != nil {
		edit(&opts)
	}
	f.lib = New(opts, slog.New(slog.DiscardHandler))
	return f
}

// MustEnd records a task that asked save_to_shared (or not, save false),
// with files in its output/, and its successful end.
func (f *fixture) MustEnd(tb testing.TB, save bool, files map[string]string) task.Task {
	tb.Helper()
	id := task.NewID()
	dir, err := f.data.CreateTask(id)
	if err != nil {
		tb.Fatal(err)
	}
	dir.Close()
	for name, content := range files {
		p := filepath.Join(f.data.TaskPath(id), "output", filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	ctx := context.Background()
	ev := func(typ string, payload any) eventstore.Proposed { return projection.NewEvent(typ, payload, "test") }
	if _, err := f.tasks.Create(ctx, id, ev(task.EventCreated, task.Created{Spec: task.Spec{Description: "d", Agent: task.AgentCommand, SaveToShared: save}}), ev(task.EventQueued, nil)); err != nil {
		tb.Fatal(err)
	}
	var t task.Task
	for _, e := range []eventstore.Proposed{ev(task.EventStarting, nil), ev(task.EventStarted, task.Started{SandboxName: id}), ev(task.EventCompleted, task.Completed{Status: task.Success})} {
		if t, err = f.tasks.Update(ctx, id, func(task.Task) ([]eventstore.Proposed, error) { return []eventstore.Proposed{e}, nil }); err != nil {
			tb.Fatal(err)
		}
	}
	return t
}

// RunSaves runs the library's saves until the test ends or stop is called.
func (f *fixture) RunSaves(tb testing.TB) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.lib.RunSaves(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				tb.Errorf("RunSaves: %v", err)
			}
		})
	}
	tb.Cleanup(stop)
	return stop
}

// events returns the events of a task's stream.
func (f *fixture) events(tb testing.TB, id string) []eventstore.Event {
	tb.Helper()
	evs, err := f.store.ReadStream(context.Background(), task.StreamID(id), 0)
	if err != nil {
		tb.Fatal(err)
	}
	return evs
}

// waitSaved waits until task id's copy is recorded and returns its event.
func (f *fixture) waitSaved(tb testing.TB, id string) eventstore.Event {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ch := f.tasks.Changed()
		if !f.tasks.SavePending(id) {
			for _, e := range f.events(tb, id) {
				if e.Type == task.EventOutputsSaved || e.Type == task.EventOutputsSaveFailed {
					return e
				}
			}
		}
		select {
		case <-ch:
		case <-time.After(time.Until(deadline)):
			tb.Fatalf("task %s: no outputs_saved within 30 s", id)
		}
	}
}

func payload(tb testing.TB, e eventstore.Event) task.OutputsSaved {
	tb.Helper()
	var p task.OutputsSaved
	if err := json.Unmarshal(e.Data, &p); err != nil {
		tb.Fatal(err)
	}
	return p
}

// sharedFiles lists the regular files beneath shared/<dir>.
func (f *fixture) sharedFiles(tb testing.TB, dir string) []string {
	tb.Helper()
	var out []string
	root := f.data.HostPath("shared", dir)
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(root, p)
			out = append(out, filepath.ToSlash(rel))
		}
		return nil
	})
	slices.Sort(out)
	return out
}

// TestSaveFollowsTheEnd: a task's copy is recorded after its end, caused
// by it, once, in the directory of its end's month; the task then says
// where. A task that did not ask has nothing copied.
func TestSaveFollowsTheEnd(t *testing.T) {
	f := MustNew(t, nil)
	// The end's month decides the directory, not the copy's: a copy done
	// again after a restart lands where the first one began.
	f.now = time.Date(2031, 7, 1, 0, 0, 0, 0, time.UTC)
	tk := f.MustEnd(t, true, map[string]string{"report.md": "# r\n", "tools/chart.py": "print(1)\n"})
	plain := f.MustEnd(t, false, map[string]string{"x.txt": "x"})
	if !tk.SavePending() || tk.SharedOutputs.After == "" {
		t.Fatalf("ended task: %+v, want its copy pending", tk.SharedOutputs)
	}
	f.RunSaves(t)
	e := f.waitSaved(t, tk.ID)
	evs := f.events(t, tk.ID)
	if e.Type != task.EventOutputsSaved || e.CausationID != tk.SharedOutputs.After || e.CorrelationID != tk.CorrelationID || e.StreamVersion != tk.Version+1 {
		t.Errorf("copy's event %s v%d caused by %s (correlation %s); want outputs_saved v%d caused by the end %s (%s)", e.Type, e.StreamVersion, e.CausationID, e.CorrelationID, tk.Version+1, tk.SharedOutputs.After, tk.CorrelationID)
	}
	month := tk.CompletedAt.UTC().Format("2006-01")
	dir := "outputs/" + month + "/" + tk.ID
	p := payload(t, e)
	want := []task.SavedFile{{From: "report.md", To: dir + "/report.md", Size: 4}, {From: "tools/chart.py", To: dir + "/tools/chart.py", Size: 9}, {From: "tools/chart.py", To: "scripts/chart.py", Size: 9}}
	if p.Directory != "shared/"+dir || !slices.Equal(p.Files, want) || p.Error != "" {
		t.Errorf("outputs_saved %+v, want %s with %+v", p, dir, want)
	}
	if got := f.sharedFiles(t, dir); !slices.Equal(got, []string{"report.md", "tools/chart.py"}) {
		t.Errorf("shared/%s holds %v", dir, got)
	}
	got, err := f.tasks.Get(tk.ID)
	if err != nil || got.SharedOutputs == nil || got.SharedOutputs.State != task.SaveSaved || got.SharedOutputs.Directory != "shared/"+dir {
		t.Errorf("task after the copy: %+v, %v", got.SharedOutputs, err)
	}
	// A later change of the projection does not copy it again.
	f.MustEnd(t, false, nil)
	if n := countSaves(f.events(t, tk.ID)); n != 1 || len(evs) != len(f.events(t, tk.ID)) {
		t.Errorf("%d copy events, want 1", n)
	}
	if f.tasks.SavePending(plain.ID) || countSaves(f.events(t, plain.ID)) != 0 || plain.SharedOutputs != nil {
		t.Errorf("a task that did not ask save_to_shared: %+v", plain.SharedOutputs)
	}
}

func countSaves(evs []eventstore.Event) int {
	n := 0
	for _, e := range evs {
		if e.Type == task.EventOutputsSaved || e.Type == task.EventOutputsSaveFailed {
			n++
		}
	}
	return n
}

// TestSaveInterruptedIsDoneAgain: a copy stopped by a shutdown records
// nothing and leaves the task pending; the next run (a restart) empties
// what the first left (a part of the files, a temporary file) and records
// the copy once; a third run changes nothing.
func TestSaveInterruptedIsDoneAgain(t *testing.T) {
	f := MustNew(t, nil)
	tk := f.MustEnd(t, true, map[string]string{"a.txt": "a", "b.txt": "b"})
	started := make(chan struct{})
	f.lib.copyHook = func(ctx context.Context, id string) {
		close(started)
		<-ctx.Done() // until the shutdown
	}
	stop := f.RunSaves(t)
	<-started
	stop()
	if !f.tasks.SavePending(tk.ID) || countSaves(f.events(t, tk.ID)) != 0 {
		t.Fatalf("a copy stopped by a shutdown was recorded")
	}
	// What a crash in the middle of the copy would have left.
	dir := "outputs/" + tk.CompletedAt.UTC().Format("2006-01") + "/" + tk.ID
	for _, name := range []string{"a.txt", ".corral-tmp-x1y2z3"} {
		p := f.data.HostPath("shared", dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte("torn"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f.lib.copyHook = nil
	stop = f.RunSaves(t)
	e := f.waitSaved(t, tk.ID)
	stop()
	if p := payload(t, e); e.Type != task.EventOutputsSaved || len(p.Files) != 2 {
		t.Errorf("after the restart: %s %+v", e.Type, p)
	}
	if got := f.sharedFiles(t, dir); !slices.Equal(got, []string{"a.txt", "b.txt"}) {
		t.Errorf("shared/%s holds %v, want a.txt and b.txt alone", dir, got)
	}
	if b, _ := os.ReadFile(f.data.HostPath("shared", dir, "a.txt")); string(b) != "a" {
		t.Errorf("a.txt holds %q, want the task's", b)
	}
	f.RunSaves(t)
	f.MustEnd(t, false, nil) // a change for the third run to look at
	time.Sleep(50 * time.Millisecond)
	if n := countSaves(f.events(t, tk.ID)); n != 1 {
		t.Errorf("%d copy events after a third run, want 1", n)
	}
}

// TestSavesQueue: tasks ending together are copied at most saveWorkers at
// a time, each once.
func TestSavesQueue(t *testing.T) {
	f := MustNew(t, nil)
	var mu sync.Mutex
	running, most := 0, 0
	release := make(chan struct{})
	f.lib.copyHook = func(ctx context.Context, id string) {
		mu.Lock()
		running++
		most = max(most, running)
		mu.Unlock()
		<-release
		mu.Lock()
		running--
		mu.Unlock()
	}
	var ids []string
	for range 5 {
		ids = append(ids, f.MustEnd(t, true, map[string]string{"a.txt": "a"}).ID)
	}
	f.RunSaves(t)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		mu.Lock()
		n := running
		mu.Unlock()
		if n == saveWorkers {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d copies started, want %d", n, saveWorkers)
		}
	}
	time.Sleep(50 * time.Millisecond) // room for a third to start, were it allowed to
	close(release)
	for _, id := range ids {
		if e := f.waitSaved(t, id); e.Type != task.EventOutputsSaved {
			t.Errorf("task %s: %s", id, e.Type)
		}
	}
	if most != saveWorkers {
		t.Errorf("at most %d copies ran at once, want %d", most, saveWorkers)
	}
	for _, id := range ids {
		if n := countSaves(f.events(t, id)); n != 1 {
			t.Errorf("task %s: %d copy events", id, n)
		}
	}
}

// TestSaveTimeBound: a copy past its time bound stops and is recorded as
// failed, saying how far it got.
func TestSaveTimeBound(t *testing.T) {
	f := MustNew(t, nil)
	f.lib.saveTime = 10 * time.Millisecond
	f.lib.copyHook = func(ctx context.Context, id string) { <-ctx.Done() }
	tk := f.MustEnd(t, true, map[string]string{"a.txt": "a", "b.txt": "b"})
	f.RunSaves(t)
	e := f.waitSaved(t, tk.ID)
	p := payload(t, e)
	if e.Type != task.EventOutputsSaveFailed || !strings.Contains(p.Error, "saving took longer than 10ms: stopped after 0 of 2 files") {
		t.Errorf("%s %+v, want outputs_save_failed saying it took too long", e.Type, p)
	}
	if got, _ := f.tasks.Get(tk.ID); got.SharedOutputs == nil || got.SharedOutputs.State != task.SaveFailed || got.SharedOutputs.Error != p.Error {
		t.Errorf("task: %+v", got.SharedOutputs)
	}
}

// TestSaveBoundsEachFile: a script whose name and 999 suffixed ones are
// taken is skipped, not the whole copy; a file over the limit is skipped;
// past MaxSavedListed entries the event counts them instead of listing
// them.
func TestSaveBoundsEachFile(t *testing.T) {
	f := MustNew(t, func(o *Options) { o.Limits.MaxTaskDirBytes = 100 })
	scripts := f.data.HostPath("shared", "scripts")
	for i := 1; i < 1000; i++ {
		name := "x.py"
		if i > 1 {
			name = fmt.Sprintf("x-%d.py", i)
		}
		if err := os.WriteFile(filepath.Join(scripts, name), []byte(fmt.Sprintf("print(%d)\n", i)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{"x.py": "print('new')\n", "big.bin": strings.Repeat("b", 101)}
	for i := range task.MaxSavedListed + 200 {
		files[fmt.Sprintf("many/%04d.txt", i)] = "m"
	}
	tk := f.MustEnd(t, true, files)
	f.RunSaves(t)
	e := f.waitSaved(t, tk.ID)
	p := payload(t, e)
	if e.Type != task.EventOutputsSaved {
		t.Fatalf("%s: %s", e.Type, p.Error)
	}
	// 1,200 outputs and x.py copied (big.bin skipped), x.py not to scripts/.
	if len(p.Files) != task.MaxSavedListed || p.FilesTotal != task.MaxSavedListed+201 {
		t.Errorf("listed %d files of %d, want %d of %d", len(p.Files), p.FilesTotal, task.MaxSavedListed, task.MaxSavedListed+201)
	}
	var skipped []string
	for _, s := range p.Skipped {
		skipped = append(skipped, s.Name+": "+s.Reason)
	}
	if len(p.Skipped) != 2 || p.Skipped[0].Name != "big.bin" || !strings.Contains(p.Skipped[0].Reason, "over the limit") ||
		p.Skipped[1].Name != "x.py" || !strings.Contains(p.Skipped[1].Reason, "999 suffixed names are taken") {
		t.Errorf("skipped %q, want big.bin (too large) and x.py (no name in scripts/)", skipped)
	}
	dir := strings.TrimPrefix(p.Directory, "shared/")
	if b, err := os.ReadFile(f.data.HostPath("shared", dir, "x.py")); err != nil || string(b) != "print('new')\n" {
		t.Errorf("x.py under %s: %q %v", dir, b, err)
	}
	if n := len(f.sharedFiles(t, dir)); n != task.MaxSavedListed+201 {
		t.Errorf("%s holds %d files, want %d", dir, n, task.MaxSavedListed+201)
	}
}

// TestSaveFailureIsRecorded: a copy over the shared/ quota copies nothing
// and is recorded as failed.
func TestSaveFailureIsRecorded(t *testing.T) {
	f := MustNew(t, func(o *Options) { o.Limits.MaxSharedBytes = 10 })
	tk := f.MustEnd(t, true, map[string]string{"a.txt": strings.Repeat("a", 11)})
	f.RunSaves(t)
	e := f.waitSaved(t, tk.ID)
	if p := payload(t, e); e.Type != task.EventOutputsSaveFailed || !strings.Contains(p.Error, "quota exceeded") {
		t.Errorf("%s %+v, want outputs_save_failed over the quota", e.Type, p)
	}
	if got := f.sharedFiles(t, "outputs"); len(got) != 0 {
		t.Errorf("shared/outputs holds %v", got)
	}
}

// TestRetentionWaitsForTheSave: the retention sweep leaves the directory
// of a task whose copy is pending, or under way, and removes it once the
// copy is recorded.
func TestRetentionWaitsForTheSave(t *testing.T) {
	f := MustNew(t, func(o *Options) { o.Retention.TaskDirs = time.Hour })
	tk := f.MustEnd(t, true, map[string]string{"a.txt": "a"})
	f.now = time.Now().Add(2 * time.Hour)
	ctx := context.Background()
	removed := func() []string {
		t.Helper()
		rep, err := f.lib.GC(ctx, service.GCRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, it := range rep.TaskDirectories {
			ids = append(ids, it.ID)
		}
		return ids
	}
	if got := removed(); len(got) != 0 {
		t.Fatalf("the sweep removed %v before the copy", got)
	}
	copying := make(chan struct{})
	release := make(chan struct{})
	f.lib.copyHook = func(ctx context.Context, id string) {
		close(copying)
		<-release
	}
	f.RunSaves(t)
	<-copying
	if got := removed(); len(got) != 0 {
		t.Fatalf("the sweep removed %v during the copy", got)
	}
	close(release)
	if e := f.waitSaved(t, tk.ID); e.Type != task.EventOutputsSaved {
		t.Fatalf("copy: %s %s", e.Type, e.Data)
	}
	if got := removed(); !slices.Equal(got, []string{tk.ID}) {
		t.Errorf("after the copy the sweep removed %v, want %s", got, tk.ID)
	}
}
