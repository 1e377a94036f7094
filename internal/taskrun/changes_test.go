package taskrun

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/task"
)

// TestBoundChanges: a worker's report of its changes is hostile; the
// result holds at most 1,000 names a list (4 KiB each, valid UTF-8) and 100
// commits (subjects cut as messages are), and says when it cut; a cut
// string ends in "…".
func TestBoundChanges(t *testing.T) {
	if boundChanges(nil, nil) != nil {
		t.Error("no report became one")
	}
	in := &task.Changes{Modified: []string{"ok.txt", "bad\xff.txt", strings.Repeat("n", 10000)}}
	for i := range 5000 {
		in.Added = append(in.Added, strings.Repeat("a", i%7+1))
	}
	for range 300 {
		in.Commits = append(in.Commits, task.Commit{Hash: strings.Repeat("f", 500), Subject: strings.Repeat("s", 5000)})
	}
	out := boundChanges(in, func(s string) string { return s })
	if len(out.Added) != 1000 || len(out.Commits) != 100 || !out.Truncated {
		t.Errorf("bounded to %d added, %d commits, truncated %v; want 1000, 100, true", len(out.Added), len(out.Commits), out.Truncated)
	}
	for _, n := range out.Modified {
		if !utf8.ValidString(n) || len(n) > 4096+len("…") {
			t.Errorf("a name of %d bytes, valid UTF-8 %v", len(n), utf8.ValidString(n))
		}
	}
	if c := out.Commits[0]; len(c.Hash) > 64+len("…") || len(c.Subject) > maxMessage+len("…") {
		t.Errorf("a commit of %d+%d bytes", len(c.Hash), len(c.Subject))
	}
	if out.Deleted == nil {
		t.Error("an empty list is null, want []")
	}
}
