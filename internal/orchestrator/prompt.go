package orchestrator

import (
	"fmt"
	"path"
	"strings"

	"github.com/corral-dev/corral/internal/task"
)

// Prompt returns prompt.md for a task: the task description and a short
// standard preamble telling the agent where its context is and where its
// results go (SPEC §2).
func Prompt(spec task.Spec) string {
	var b strings.Builder
	b.WriteString("# Task\n\n")
	b.WriteString(strings.TrimSpace(spec.Description))
	b.WriteString("\n\n---\n\n## How you work here\n\n")
	b.WriteString("You are a Corral worker running in an isolated sandbox. Work without asking questions: nobody will answer.\n\n")
	b.WriteString("- Your working directory is `/task`; it is yours to write.\n")
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
	return b.String()
}
