package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/termsafe"
)

// skillsCmd is corral skills [ls] | show NAME | create: the skills in
// shared/skills/.
func skillsCmd() *cobra.Command {
	cmd := skillsLsCmd("skills")
	cmd.Short = "The skills in shared/skills/: list them (show NAME, create)"
	ls := skillsLsCmd("ls")
	ls.Aliases = []string{"list"}
	cmd.AddCommand(ls, skillsShowCmd(), skillsCreateCmd())
	return cmd
}

// skillsLister prints skills.
var skillsLister = lister[service.SkillInfo]{
	kind:   "skill",
	header: []string{"SKILL", "DESCRIPTION"},
	narrow: 2,
	row: func(s service.SkillInfo) []string {
		d := termsafe.Line(s.Summary(100))
		if s.Error != "" {
			d = "(invalid: " + oneLine(s.Error, 90) + ")"
		}
		return []string{termsafe.Name(s.Name), d}
	},
	id: func(s service.SkillInfo) string { return termsafe.Name(s.Name) },
}

func skillsLsCmd(use string) *cobra.Command {
	cmd := &cobra.Command{Use: use, Short: "List the skills", Args: cobra.NoArgs}
	cf := clientCmd(cmd)
	lf := addListFlags(cmd, false)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		skills, err := c.ListSkills(cmd.Context())
		if err != nil {
			return err
		}
		return skillsLister.run(cmd.Context(), cmd.OutOrStdout(), lf, skills, skills, nil)
	}
	return cmd
}

func skillsShowCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "show NAME", Aliases: []string{"get"}, Short: "A skill's SKILL.md and files", Args: exactArgs(1, "a skill's name: corral skills show NAME")}
	cf := clientCmd(cmd)
	out := outputFlags(cmd, objectFormats)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		s, err := c.GetSkill(cmd.Context(), args[0])
		if err != nil {
			return err
		}
		stdout := cmd.OutOrStdout()
		return out.print(stdout, s, func() error {
			io.WriteString(stdout, termsafe.Text(s.Content))
			if len(s.Files) > 1 {
				fmt.Fprintf(stdout, "\n-- files in shared/skills/%s/:\n", termsafe.Name(s.Name))
				for _, f := range s.Files {
					fmt.Fprintf(stdout, "%s\t%d\n", termsafe.Name(f.Path), f.Size)
				}
			}
			return nil
		})
	}
	return cmd
}

func skillsCreateCmd() *cobra.Command {
	var (
		req                service.CreateSkillRequest
		file, instr, files string
	)
	cmd := &cobra.Command{
		Use:   "create (--file SKILL.md | NAME --description TEXT [--instructions FILE] [--docker-image IMAGE] [--dependency DEP]...) [--from-task ID [--files a,b]]",
		Short: "Make a skill in shared/skills/",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usagef("unexpected argument %q: one skill name at most", args[1])
			}
			return nil
		},
	}
	cf := clientCmd(cmd)
	out := outputFlags(cmd, objectFormats)
	f := cmd.Flags()
	f.StringVar(&file, "file", "", "a whole SKILL.md (- for stdin)")
	f.StringVar(&req.Description, "description", "", "the one-line description")
	f.StringVar(&instr, "instructions", "", "a Markdown file with the instructions (- for stdin)")
	f.StringVar(&req.DockerImage, "docker-image", "", "the image the skill needs")
	f.StringArrayVar(&req.Dependencies, "dependency", nil, "a dependency (repeatable)")
	f.StringVar(&req.TaskID, "from-task", "", "a task that succeeded (an id or a unique prefix), whose output files join the skill")
	f.StringVar(&files, "files", "", "comma-separated output files of --from-task (default: all)")
	cmd.RegisterFlagCompletionFunc("from-task", completeTasks(cf))
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if files != "" {
			req.Files = strings.Split(files, ",")
		}
		if file != "" {
			b, err := readArg(file)
			if err != nil {
				return err
			}
			req.Content = string(b)
		}
		if instr != "" {
			b, err := readArg(instr)
			if err != nil {
				return err
			}
			req.Instructions = string(b)
		}
		if len(args) == 1 {
			req.Name = args[0]
		}
		c, err := cf.client()
		if err != nil {
			return err
		}
		if req.TaskID != "" {
			if req.TaskID, err = resolveTask(cmd.Context(), c, req.TaskID); err != nil {
				return err
			}
		}
		s, err := c.CreateSkill(cmd.Context(), req)
		if err != nil {
			return err
		}
		return out.print(cmd.OutOrStdout(), s, func() error {
			name := termsafe.Name(s.Name)
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "created skill %s in shared/skills/%s/ (%d files)\n", name, name, len(s.Files))
			return err
		})
	}
	return cmd
}

// readArg reads a file named on the command line, or stdin for "-".
func readArg(name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(os.Stdin)
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return nil, fileError("read", name, err)
	}
	return b, nil
}
