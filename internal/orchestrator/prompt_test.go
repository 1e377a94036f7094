package orchestrator

import (
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/library"
	"github.com/corral-dev/corral/internal/task"
)

// Prompt is the whole of what a worker reads: every part in its place, the
// follow-up section after the lists (before, the skills were listed under
// its heading).
func TestPromptHasEveryPartInOrder(t *testing.T) {
	got := Prompt(PromptInput{
		Spec:        task.Spec{Description: "  Chart the spending.\n", ContextFiles: []string{"data/bank.csv"}, NoteQuery: "budget\nplans"},
		Attachments: []library.ContextFile{{Name: "statement.pdf", About: "(application/pdf, 1234 bytes)"}},
		Documents:   []library.ContextFile{{Name: "doc_1_report.md", About: "Last report (text/markdown)"}},
		Notes:       []library.ContextFile{{Name: "note-1.md", About: "Budget"}},
		FollowUp:    &task.Task{ID: "task-01", Status: task.Success},
		Skills:      []library.ContextFile{{Name: "csv-totals/SKILL.md", About: "Total a CSV column."}},
		MoreSkills:  true,
	})
	want := []string{
		"# Task\n\nChart the spending.\n\n---\n\n## How you work here\n",
		"- Input files for this task are in `/task/context/`:\n  - `/task/context/bank.csv` (from `shared/data/bank.csv`)\n",
		"- Put every result file in `/task/output/`.",
		"- Attachments from the user, copied into `/task/context/`:\n  - `/task/context/statement.pdf` (application/pdf, 1234 bytes)\n",
		"- Documents from the index, copied into `/task/context/`:\n  - `/task/context/doc_1_report.md`: Last report (text/markdown)\n",
		"- Notes matching \"budget plans\", as Markdown with frontmatter, in `/task/context/notes/`:\n  - `/task/context/notes/note-1.md`: Budget\n",
		"- Skills (read a skill's SKILL.md before using it; its scripts are beside it):\n  - `/workspace/shared/skills/csv-totals/SKILL.md`: Total a CSV column.\n  - … and more in `/workspace/shared/skills/`\n",
		"\n## Follow-up\n\nThis task continues task task-01 (success). Its output files are in `/task/context/previous/`.\n",
	}
	at := 0
	for _, w := range want {
		i := strings.Index(got[at:], w)
		if i < 0 {
			t.Fatalf("prompt lacks, after byte %d:\n%s\n--- prompt:\n%s", at, w, got)
		}
		at += i + len(w)
	}
	if at != len(got) {
		t.Errorf("prompt goes on after the follow-up:\n%s", got[at:])
	}
	// Nothing listed, nothing said.
	bare := Prompt(PromptInput{Spec: task.Spec{Description: "x"}})
	for _, s := range []string{"Attachments", "Documents", "Notes", "Skills", "Follow-up"} {
		if strings.Contains(bare, s) {
			t.Errorf("a bare prompt mentions %s:\n%s", s, bare)
		}
	}
}
