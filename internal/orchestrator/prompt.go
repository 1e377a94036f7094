package orchestrator

import (
	"fmt"
	"path"
	"strings"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/library"
	"github.com/corral-dev/corral/internal/workerproto"

	"github.com/corral-dev/corral/internal/task"
)

// PromptInput is everything prompt.md tells a worker: the task, and what
// Spawn placed in its task directory for it.
type PromptInput struct {
	Spec task.Spec
	// Attachments are the attachments copied into context/, under the
	// names they took there.
	Attachments []library.ContextFile
	// Documents are the indexed documents copied into context/.
	Documents []library.ContextFile
	// Notes are the notes note_query found, written to context/notes/.
	Notes []library.ContextFile
	// FollowUp is the task this one continues, if any.
	FollowUp *task.Task
	// Skills are the valid skills, listed with their summaries; MoreSkills
	// says there are more than listed.
	Skills     []library.ContextFile
	MoreSkills bool
}

// Prompt returns prompt.md for a task: the task description and a short
// standard preamble telling the agent where its context is and where its
// results go (SPEC §2). This is the one place that says what a worker
// reads.
func Prompt(in PromptInput) string {
	spec := in.Spec
	var b strings.Builder
	b.WriteString("# Task\n\n")
	b.WriteString(strings.TrimSpace(spec.Description))
	b.WriteString("\n\n---\n\n## How you work here\n\n")
	b.WriteString("You are a Corral worker running in an isolated sandbox. Work without asking questions: nobody will answer.\n\n")
	if spec.Workspace != "" {
		fmt.Fprintf(&b, "- Your working directory is `%s`, the workspace %q: a project that outlives this task. Make your changes there; the next task in this workspace continues from them.\n", workerproto.ProjectDir, spec.Workspace)
		b.WriteString("- `/task` is this task's own directory (prompt, logs), yours to write too.\n")
	} else {
		b.WriteString("- Your working directory is `/task`; it is yours to write.\n")
	}
	if len(spec.ContextFiles) > 0 {
		b.WriteString("- Input files for this task are in `/task/context/`:\n")
		for _, f := range spec.ContextFiles {
			fmt.Fprintf(&b, "  - `/task/context/%s` (from `shared/%s`)\n", path.Base(f), f)
		}
	} else {
		b.WriteString("- Input files, if any, are in `/task/context/`.\n")
	}
	b.WriteString("- `/workspace/shared/` holds persistent files (scripts, data, skills) from earlier work; it is read-only.\n")
	b.WriteString("- Put every result file in `/task/output/`. A short `/task/output/summary.md` saying what you did and found is welcome.\n")
	b.WriteString("- The network may be unavailable; do not depend on downloading anything.\n")
	list := func(heading, dir string, files []library.ContextFile, sep string) {
		if len(files) == 0 {
			return
		}
		b.WriteString(heading)
		for _, f := range files {
			fmt.Fprintf(&b, "  - `%s%s`%s%s\n", dir, f.Name, sep, f.About)
		}
	}
	list("- Attachments from the user, copied into `/task/context/`:\n", "/task/context/", in.Attachments, " ")
	list("- Documents from the index, copied into `/task/context/`:\n", "/task/context/", in.Documents, ": ")
	list(fmt.Sprintf("- Notes matching %q, as Markdown with frontmatter, in `/task/context/notes/`:\n", clip.Line(spec.NoteQuery, 200)), "/task/context/notes/", in.Notes, ": ")
	list("- Skills (read a skill's SKILL.md before using it; its scripts are beside it):\n", "/workspace/shared/skills/", in.Skills, ": ")
	if in.MoreSkills {
		b.WriteString("  - … and more in `/workspace/shared/skills/`\n")
	}
	if prev := in.FollowUp; prev != nil {
		fmt.Fprintf(&b, "\n## Follow-up\n\nThis task continues task %s (%s). Its output files are in `/task/%s/`.\n", prev.ID, prev.Status, followUpDir)
	}
	return b.String()
}
