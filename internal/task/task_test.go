package task

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
)

var allStatuses = []Status{Pending, Queued, Starting, Running, Success, Failed, Timeout, Cancelled}

func TestCanMoveTo(t *testing.T) {
	order := map[Status]int{Pending: 0, Queued: 1, Starting: 2, Running: 3}
	for _, from := range allStatuses {
		for _, to := range allStatuses {
			want := false
			if !from.Terminal() {
				if to.Terminal() {
					want = true
				} else {
					want = order[to] > order[from]
				}
			}
			if got := from.CanMoveTo(to); got != want {
				t.Errorf("%s.CanMoveTo(%s) = %v, want %v", from, to, got, want)
			}
		}
	}
	// Spot checks that do not depend on the loop's own logic.
	for _, c := range []struct {
		from, to Status
		want     bool
	}{
		{Pending, Queued, true},
		{Queued, Running, true},
		{Running, Queued, false},
		{Running, Running, false},
		{Success, Failed, false},
		{Cancelled, Cancelled, false},
		{Queued, Cancelled, true},
		{"bogus", Queued, false},
		{Queued, "bogus", false},
	} {
		if got := c.from.CanMoveTo(c.to); got != c.want {
			t.Errorf("%q.CanMoveTo(%q) = %v, want %v", c.from, c.to, got, c.want)
		}
	}
}

func TestTerminalAndValid(t *testing.T) {
	for _, s := range allStatuses {
		if !s.Valid() {
			t.Errorf("%s.Valid() = false", s)
		}
		want := s == Success || s == Failed || s == Timeout || s == Cancelled
		if got := s.Terminal(); got != want {
			t.Errorf("%s.Terminal() = %v, want %v", s, got, want)
		}
	}
	if Status("done").Valid() || Status("").Valid() {
		t.Error("unknown status reported valid")
	}
}

func mustJSON(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// mustFold applies the usual start of a task's life: created, queued,
// starting, started.
func mustFold(tb testing.TB, t0 time.Time) *Task {
	tb.Helper()
	tk := &Task{ID: "task-00000000000000000000000000"}
	steps := []struct {
		typ  string
		data []byte
	}{
		{EventCreated, mustJSON(tb, Created{Spec: Spec{Description: "d", Agent: AgentCommand, TimeoutMinutes: 5}, PromptSHA256: "ab12"})},
		{EventQueued, []byte("{}")},
		{EventStarting, []byte("{}")},
		{EventStarted, mustJSON(tb, Started{SandboxName: "sb", Handle: json.RawMessage(`{"id":"sb"}`)})},
	}
	for i, s := range steps {
		if err := tk.Apply(event(s.typ, s.data, int64(i+1), t0.Add(time.Duration(i)*time.Second), int64(10+i))); err != nil {
			tb.Fatalf("Apply(%s): %v", s.typ, err)
		}
	}
	return tk
}

func TestApplyFold(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tk := mustFold(t, t0)
	if tk.Status != Running || tk.Version != 4 {
		t.Fatalf("after start: status %s version %d, want running 4", tk.Status, tk.Version)
	}
	if tk.QueuedAt == nil || !tk.QueuedAt.Equal(t0.Add(time.Second)) || tk.QueueSeq != 11 {
		t.Errorf("queued at %v seq %d, want %v 11", tk.QueuedAt, tk.QueueSeq, t0.Add(time.Second))
	}
	if tk.SandboxName != "sb" || string(tk.Handle) != `{"id":"sb"}` || tk.StartedAt == nil || !tk.StartedAt.Equal(t0.Add(3*time.Second)) {
		t.Errorf("started fields: %q %s %v", tk.SandboxName, tk.Handle, tk.StartedAt)
	}
	if !tk.CreatedAt.Equal(t0) || tk.Description != "d" || tk.PromptSHA256 != "ab12" {
		t.Errorf("created fields: %v %q %q", tk.CreatedAt, tk.Description, tk.PromptSHA256)
	}

	if err := tk.Apply(event(EventCancelRequested, mustJSON(t, CancelRequested{Reason: "r"}), 5, t0.Add(4*time.Second), 20)); err != nil {
		t.Fatal(err)
	}
	if !tk.CancelRequested || tk.Status != Running {
		t.Errorf("cancel requested: %v status %s", tk.CancelRequested, tk.Status)
	}

	code := 3
	end := t0.Add(13 * time.Second)
	c := Completed{Status: Failed, ExitCode: &code, OutputFiles: []OutputFile{{Name: "a.txt", Size: 1, Type: "text/plain"}}, Summary: "s", ErrorMessage: "e", LogsTruncated: true}
	if err := tk.Apply(event(EventCompleted, mustJSON(t, c), 6, end, 21)); err != nil {
		t.Fatal(err)
	}
	if tk.Status != Failed || tk.CompletedAt == nil || !tk.CompletedAt.Equal(end) || !tk.UpdatedAt.Equal(end) {
		t.Errorf("completed: status %s at %v updated %v", tk.Status, tk.CompletedAt, tk.UpdatedAt)
	}
	if tk.ExitCode == nil || *tk.ExitCode != 3 || tk.Summary != "s" || tk.ErrorMessage != "e" || !tk.LogsTruncated {
		t.Errorf("completed fields: %+v", tk)
	}
	if diff := cmp.Diff(c.OutputFiles, tk.OutputFiles); diff != "" {
		t.Errorf("output files (-want +got):\n%s", diff)
	}
	// What only a live task needs is gone; its sandbox's name stays.
	if tk.Handle != nil || tk.PromptSHA256 != "" || tk.SandboxName != "sb" {
		t.Errorf("ended task: handle %s, prompt hash %q, sandbox %q; want neither, and the name", tk.Handle, tk.PromptSHA256, tk.SandboxName)
	}
	// Duration from StartedAt (t0+3s) to the completion (t0+13s).
	if tk.DurationSeconds == nil || *tk.DurationSeconds != 10 {
		t.Errorf("duration = %v, want 10", tk.DurationSeconds)
	}

	// Terminal is final: no second completion, no going back.
	for _, typ := range []string{EventCompleted, EventQueued, EventStarting} {
		cp := *tk
		data := []byte("{}")
		if typ == EventCompleted {
			data = mustJSON(t, Completed{Status: Success})
		}
		if err := cp.Apply(event(typ, data, 7, end, 22)); err == nil {
			t.Errorf("Apply(%s) after failed: nil error, status %s", typ, cp.Status)
		}
	}
}

func TestApplyCompletedDurationFromPayload(t *testing.T) {
	t0 := time.Now()
	tk := mustFold(t, t0)
	d := 42.5
	if err := tk.Apply(event(EventCompleted, mustJSON(t, Completed{Status: Success, DurationSeconds: &d}), 5, t0.Add(time.Hour), 30)); err != nil {
		t.Fatal(err)
	}
	// The seed's integer seconds (rounded), and the milliseconds.
	if tk.DurationSeconds == nil || *tk.DurationSeconds != 43 || tk.DurationMS == nil || *tk.DurationMS != 42500 {
		t.Errorf("duration = %v s, %v ms, want 43 and 42500 from the payload's 42.5", tk.DurationSeconds, tk.DurationMS)
	}
	b, _ := json.Marshal(tk)
	if !strings.Contains(string(b), `"duration_seconds":43,`) || !strings.Contains(string(b), `"duration_ms":42500`) {
		t.Errorf("task JSON %s: want integer duration_seconds and duration_ms", b)
	}
}

func TestApplyCancelledBeforeStartHasNoDuration(t *testing.T) {
	tk := &Task{ID: "task-x"}
	if err := tk.Apply(event(EventCreated, mustJSON(t, Created{}), 1, time.Now(), 1)); err != nil {
		t.Fatal(err)
	}
	if err := tk.Apply(event(EventCompleted, mustJSON(t, Completed{Status: Cancelled}), 2, time.Now(), 2)); err != nil {
		t.Fatal(err)
	}
	if tk.Status != Cancelled || tk.DurationSeconds != nil {
		t.Errorf("status %s duration %v, want cancelled and no duration", tk.Status, tk.DurationSeconds)
	}
}

func TestApplyRefuses(t *testing.T) {
	t0 := time.Now()
	created := mustJSON(t, Created{})
	tests := []struct {
		name string
		prep func(tb testing.TB) *Task
		typ  string
		data []byte
		ver  int64
	}{
		// Retention leaves gaps after the first event (TestApplyCompactedStream), never before it.
		{"version gap", func(tb testing.TB) *Task { return &Task{ID: "t"} }, EventCreated, created, 2},
		{"version repeat", func(tb testing.TB) *Task { return mustFold(tb, t0) }, EventCancelRequested, []byte("{}"), 4},
		{"version zero", func(tb testing.TB) *Task { return &Task{ID: "t"} }, EventCreated, created, 0},
		{"backwards running to queued", func(tb testing.TB) *Task { return mustFold(tb, t0) }, EventQueued, []byte("{}"), 5},
		{"backwards running to starting", func(tb testing.TB) *Task { return mustFold(tb, t0) }, EventStarting, []byte("{}"), 5},
		{"second created", func(tb testing.TB) *Task { return mustFold(tb, t0) }, EventCreated, created, 5},
		{"non-terminal completion", func(tb testing.TB) *Task { return mustFold(tb, t0) }, EventCompleted, mustJSON(t, Completed{Status: Running}), 5},
		{"bad json", func(tb testing.TB) *Task { return mustFold(tb, t0) }, EventCompleted, []byte("{"), 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tk := tt.prep(t)
			before := *tk
			if err := tk.Apply(event(tt.typ, tt.data, tt.ver, t0, 99)); err == nil {
				t.Fatalf("Apply(%s, v%d) = nil, want error", tt.typ, tt.ver)
			}
			if tk.Version != before.Version {
				t.Errorf("version moved from %d to %d on a refused event", before.Version, tk.Version)
			}
		})
	}
}

// A stream retention compacted folds to the task the whole stream folds
// to: the events it removes change nothing but the version, which goes on
// over the gaps they leave, and Compactable, which counts them until the
// marker.
func TestApplyCompactedStream(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	whole, compacted := mustFold(t, t0), mustFold(t, t0)
	v := whole.Version
	next := func(typ string, data []byte) eventstore.Event {
		v++
		return event(typ, data, v, t0.Add(time.Duration(v)*time.Second), 10+v)
	}
	for _, typ := range CompactedTypes {
		if typ != EventCompacted {
			if err := whole.Apply(next(typ, []byte("{}"))); err != nil {
				t.Fatalf("Apply(%s): %v", typ, err)
			}
		}
	}
	end := next(EventCompleted, mustJSON(t, Completed{Status: Success, Summary: "done"}))
	marker := next(EventCompacted, mustJSON(t, Compacted{Removed: len(CompactedTypes) - 1, Through: end.StreamVersion}))
	for i, e := range []eventstore.Event{end, marker} {
		if err := whole.Apply(e); err != nil {
			t.Fatalf("whole stream: Apply(%s): %v", e.Type, err)
		}
		if err := compacted.Apply(e); err != nil {
			t.Fatalf("compacted stream: Apply(%s) at version %d after %d: %v", e.Type, e.StreamVersion, compacted.Version-1, err)
		}
		if want := int64(len(CompactedTypes) - 1); i == 0 && whole.Compactable != want {
			t.Errorf("Compactable of the ended task: %d, want %d", whole.Compactable, want)
		}
	}
	if diff := cmp.Diff(whole, compacted); diff != "" {
		t.Errorf("the compacted stream's task (-whole +compacted):\n%s", diff)
	}
	if compacted.Compactable != 0 || compacted.Version != v || compacted.Status != Success {
		t.Errorf("compacted: Compactable %d version %d status %s, want 0, %d, success", compacted.Compactable, compacted.Version, compacted.Status, v)
	}
}

func TestApplyUnknownEventOnlyBumpsVersion(t *testing.T) {
	tk := mustFold(t, time.Now())
	before := *tk
	at := time.Now().Add(time.Minute)
	if err := tk.Apply(event("from_the_future", []byte(`{"x":1}`), 5, at, 50)); err != nil {
		t.Fatal(err)
	}
	if tk.Version != 5 || tk.Status != before.Status || !tk.UpdatedAt.Equal(at) {
		t.Errorf("got version %d status %s updated %v", tk.Version, tk.Status, tk.UpdatedAt)
	}
}

func TestCheckID(t *testing.T) {
	id := NewID()
	if !ValidID(id) {
		t.Fatalf("ValidID(NewID()=%q) = false", id)
	}
	if err := CheckID(id); err != nil {
		t.Errorf("CheckID(%q) = %v", id, err)
	}
	for _, bad := range []string{
		"",
		"task-",
		strings.TrimPrefix(id, "task-"),
		"job-" + strings.TrimPrefix(id, "task-"),
		id + "0",
		id[:len(id)-1],
		strings.ToUpper(id),
		"task-" + strings.Repeat("a", 25) + "/",
		"task-../../../../../../../etc/passwd",
		strings.Repeat("x", 1000),
	} {
		if ValidID(bad) {
			t.Errorf("ValidID(%q) = true", bad)
		}
		err := CheckID(bad)
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("CheckID(%q) = %v, want ErrInvalidArgument", bad, err)
			continue
		}
		var fe *errdefs.FieldError
		if !errors.As(err, &fe) || fe.Field != "task_id" {
			t.Errorf("CheckID(%q) = %v, want a FieldError on task_id", bad, err)
		}
		if len(err.Error()) > 200 {
			t.Errorf("CheckID error for a long id is %d bytes, want it truncated", len(err.Error()))
		}
	}
}

func TestStreamID(t *testing.T) {
	id := NewID()
	if got := IDFromStream(StreamID(id)); got != id {
		t.Errorf("IDFromStream(StreamID(%q)) = %q", id, got)
	}
	if got := IDFromStream(SystemStream); got != "" {
		t.Errorf("IDFromStream(%q) = %q, want empty", SystemStream, got)
	}
}

// A progress item reads as one line of what the agent did, never raw JSON.
func TestProgressLine(t *testing.T) {
	for _, tc := range []struct {
		p    Progress
		want string
	}{
		{Progress{Kind: "text", Text: "Reading the CSV\nnow"}, "Reading the CSV now"},
		{Progress{Kind: "tool_use", Tool: "Bash", Input: "python3 chart.py"}, "Bash: python3 chart.py"},
		{Progress{Kind: "tool_result", Tool: "Bash", Status: "ok"}, "Bash ok"},
		{Progress{Kind: "tool_result", Status: "error"}, "error"},
		{Progress{Kind: "init"}, "agent started"},
		{Progress{Kind: "text", Text: "| total |", Coalesced: 6}, "| total | (+6 more)"},
		{Progress{Kind: "progress_dropped"}, "progress_dropped"},
	} {
		if got := tc.p.Line(); got != tc.want {
			t.Errorf("%+v.Line() = %q, want %q", tc.p, got, tc.want)
		}
	}
}

// event is a committed event of a task stream, for Apply.
func event(typ string, data []byte, version int64, at time.Time, pos int64) eventstore.Event {
	return eventstore.Event{ID: fmt.Sprintf("evt_%d", pos), Type: typ, Data: data, StreamVersion: version, RecordedAt: at, Position: pos}
}

// TestApplySharedOutputs: a successful task that asked save_to_shared ends
// with its copy pending, caused by its end; the copy's event settles it,
// saved or failed, with a new value (a copy of the task made before keeps
// "pending"). A log from before the copy followed the end (the copy's event
// first) keeps what the copy said; a task that failed or did not ask has
// nothing pending.
func TestApplySharedOutputs(t *testing.T) {
	t0 := time.Now()
	saving := func(tb testing.TB) *Task {
		tk := &Task{ID: "task-x"}
		if err := tk.Apply(event(EventCreated, mustJSON(tb, Created{Spec: Spec{SaveToShared: true}}), 1, t0, 1)); err != nil {
			tb.Fatal(err)
		}
		return tk
	}
	success := mustJSON(t, Completed{Status: Success})
	saved := mustJSON(t, OutputsSaved{Directory: "shared/outputs/2026-01/task-x", Files: []SavedFile{{From: "a", To: "outputs/2026-01/task-x/a"}}})
	failed := mustJSON(t, OutputsSaved{Directory: "shared/outputs/2026-01/task-x", Error: "shared/ quota exceeded"})

	tk := saving(t)
	if err := tk.Apply(event(EventCompleted, success, 2, t0, 2)); err != nil {
		t.Fatal(err)
	}
	if !tk.SavePending() || tk.SharedOutputs.After != "evt_2" {
		t.Fatalf("after the end: %+v, want pending after evt_2", tk.SharedOutputs)
	}
	if b := mustJSON(t, tk); !strings.Contains(string(b), `"shared_outputs":{"state":"pending"}`) {
		t.Errorf("task JSON %s: want shared_outputs pending", b)
	}
	before := *tk
	if err := tk.Apply(event(EventOutputsSaved, saved, 3, t0, 3)); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&SharedOutputs{State: SaveSaved, Directory: "shared/outputs/2026-01/task-x"}, tk.SharedOutputs); diff != "" || tk.SavePending() {
		t.Errorf("after outputs_saved (-want +got):\n%s", diff)
	}
	if !before.SavePending() {
		t.Errorf("a copy made before outputs_saved changed with it: %+v", before.SharedOutputs)
	}

	tk = saving(t)
	for i, typ := range []string{EventCompleted, EventOutputsSaveFailed} {
		data := map[string][]byte{EventCompleted: success, EventOutputsSaveFailed: failed}[typ]
		if err := tk.Apply(event(typ, data, int64(i+2), t0, int64(i+2))); err != nil {
			t.Fatal(err)
		}
	}
	if s := tk.SharedOutputs; s == nil || s.State != SaveFailed || s.Error != "shared/ quota exceeded" {
		t.Errorf("after outputs_save_failed: %+v", s)
	}

	// The old order: the copy, then the end.
	tk = saving(t)
	for i, typ := range []string{EventOutputsSaved, EventCompleted} {
		data := map[string][]byte{EventCompleted: success, EventOutputsSaved: saved}[typ]
		if err := tk.Apply(event(typ, data, int64(i+2), t0, int64(i+2))); err != nil {
			t.Fatal(err)
		}
	}
	if s := tk.SharedOutputs; s == nil || s.State != SaveSaved {
		t.Errorf("copy before the end: %+v, want saved", s)
	}

	for name, c := range map[string]struct {
		save   bool
		status Status
	}{"failed": {true, Failed}, "cancelled": {true, Cancelled}, "not asked": {false, Success}} {
		tk := &Task{ID: "task-x"}
		if err := tk.Apply(event(EventCreated, mustJSON(t, Created{Spec: Spec{SaveToShared: c.save}}), 1, t0, 1)); err != nil {
			t.Fatal(err)
		}
		if err := tk.Apply(event(EventCompleted, mustJSON(t, Completed{Status: c.status}), 2, t0, 2)); err != nil {
			t.Fatal(err)
		}
		if tk.SharedOutputs != nil {
			t.Errorf("%s: shared outputs %+v, want none", name, tk.SharedOutputs)
		}
	}
}
