package tools

import (
	"context"
	"encoding/json"

	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/strictjson"
)

func listSkills(lib service.Library) Tool {
	return Tool{
		Name:        "list_skills",
		Description: "List the skills in /workspace/shared/skills/: reusable capabilities (instructions in SKILL.md, scripts beside it) that workers can use. Each has a name and a one-line description.",
		Schema:      json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`),
		Call: func(ctx context.Context, args json.RawMessage) (any, error) {
			var a struct{}
			if err := strictjson.Decode(args, &a); err != nil {
				return nil, err
			}
			skills, err := lib.ListSkills(ctx)
			if err != nil {
				return nil, err
			}
			return map[string]any{"skills": skills}, nil
		},
	}
}

func getSkill(lib service.Library) Tool {
	return Tool{
		Name:        "get_skill",
		Description: "Read a skill: its SKILL.md (frontmatter and instructions) and the list of files beside it.",
		Schema: json.RawMessage(`{"type":"object","properties":{
"name":{"type":"string","description":"The skill's name, e.g. 'expense-analyzer'."}},"required":["name"],"additionalProperties":false}`),
		Call: func(ctx context.Context, args json.RawMessage) (any, error) {
			var a struct {
				Name string `json:"name"`
			}
			if err := strictjson.Decode(args, &a); err != nil {
				return nil, err
			}
			return lib.GetSkill(ctx, a.Name)
		},
	}
}

func createSkill(lib service.Library) Tool {
	return Tool{
		Name: "create_skill",
		Description: `Create a reusable skill in /workspace/shared/skills/<name>/. Give either content (a whole
SKILL.md: YAML frontmatter with name and description, then instructions), or name, description and
instructions. With task_id (a task that succeeded), its output files (or those listed in files) are
copied beside SKILL.md, and if neither content nor name is given the task's output/SKILL.md is used.
Names are lowercase letters, digits and hyphens (at most 64); a name that exists is refused.`,
		Schema: json.RawMessage(`{"type":"object","properties":{
"content":{"type":"string","description":"A whole SKILL.md."},
"name":{"type":"string","description":"The skill's name: lowercase letters, digits, hyphens, at most 64."},
"description":{"type":"string","description":"One line: what the skill does and when to use it (at most 1024 characters)."},
"docker_image":{"type":"string","description":"Container image the skill's scripts need, if any."},
"dependencies":{"type":"array","items":{"type":"string"},"description":"Packages or tools the skill needs."},
"instructions":{"type":"string","description":"The Markdown body of SKILL.md: how to use the skill."},
"task_id":{"type":"string","description":"A task that succeeded whose output files become the skill's files."},
"files":{"type":"array","items":{"type":"string"},"description":"Which of the task's output files to copy (default: all)."}},
"additionalProperties":false}`),
		Call: decoded(lib, service.Library.CreateSkill),
	}
}
