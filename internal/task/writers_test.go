package task

import "testing"

func TestWriters(t *testing.T) {
	var w Writers
	if _, ok := w.Acquire("app", "task-1"); !ok {
		t.Fatal("a free workspace was refused")
	}
	if _, ok := w.Acquire("app", "task-1"); !ok {
		t.Error("the holder was refused its own workspace")
	}
	if h, ok := w.Acquire("app", "sess-1"); ok || h != "task-1" {
		t.Errorf("a held workspace: %q, %v; want refused, held by task-1", h, ok)
	}
	if _, ok := w.Acquire("other", "sess-1"); !ok {
		t.Error("another workspace was refused")
	}
	w.Release("app", "sess-1") // not the holder: nothing changes
	if _, ok := w.Acquire("app", "sess-2"); ok {
		t.Error("a release by another freed the workspace")
	}
	w.Release("app", "task-1")
	if _, ok := w.Acquire("app", "sess-2"); !ok {
		t.Error("a released workspace was refused")
	}
}
