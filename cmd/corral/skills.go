package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/termsafe"
)

const skillsUsage = `corral skills [ls] | show NAME | create (--file SKILL.md | NAME --description TEXT [--instructions FILE]
       [--docker-image IMAGE] [--dependency DEP]...) [--from-task ID [--files a,b]]`

func cmdSkills(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub, args, fs, cf := subcommand("skills", args, stderr)
	file := fs.String("file", "", "create: a whole SKILL.md (- for stdin)")
	desc := fs.String("description", "", "create: the one-line description")
	instr := fs.String("instructions", "", "create: a Markdown file with the instructions (- for stdin)")
	image := fs.String("docker-image", "", "create: the image the skill needs")
	var deps multiFlag
	fs.Var(&deps, "dependency", "create: a dependency (repeat for more)")
	fromTask := fs.String("from-task", "", "create: a task that succeeded, whose output files join the skill")
	files := fs.String("files", "", "create: comma-separated output files of --from-task (default: all)")
	pos, c, err := cf.parse(fs, args)
	if err != nil {
		return err
	}
	switch sub {
	case "ls", "list":
		skills, err := c.ListSkills(ctx)
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(stdout, skills)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		for _, s := range skills {
			d := termsafe.Line(s.Summary(100))
			if s.Error != "" {
				d = "(invalid: " + oneLine(s.Error, 90) + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\n", termsafe.Name(s.Name), d)
		}
		return tw.Flush()
	case "show":
		if len(pos) != 1 {
			return fmt.Errorf("usage: corral skills show NAME: %w", errdefs.ErrInvalidArgument)
		}
		s, err := c.GetSkill(ctx, pos[0])
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(stdout, s)
		}
		io.WriteString(stdout, termsafe.Text(s.Content))
		if len(s.Files) > 1 {
			fmt.Fprintf(stdout, "\n-- files in shared/skills/%s/:\n", termsafe.Name(s.Name))
			for _, f := range s.Files {
				fmt.Fprintf(stdout, "%s\t%d\n", termsafe.Name(f.Path), f.Size)
			}
		}
		return nil
	case "create":
		req := service.CreateSkillRequest{Description: *desc, DockerImage: *image, Dependencies: deps, TaskID: *fromTask}
		if *files != "" {
			req.Files = strings.Split(*files, ",")
		}
		if *file != "" {
			b, err := readArg(*file)
			if err != nil {
				return err
			}
			req.Content = string(b)
		}
		if *instr != "" {
			b, err := readArg(*instr)
			if err != nil {
				return err
			}
			req.Instructions = string(b)
		}
		if len(pos) > 1 {
			return fmt.Errorf("usage: %s: %w", skillsUsage, errdefs.ErrInvalidArgument)
		}
		if len(pos) == 1 {
			req.Name = pos[0]
		}
		s, err := c.CreateSkill(ctx, req)
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(stdout, s)
		}
		name := termsafe.Name(s.Name)
		fmt.Fprintf(stdout, "created skill %s in shared/skills/%s/ (%d files)\n", name, name, len(s.Files))
		return nil
	}
	return fmt.Errorf("usage: %s: %w", skillsUsage, errdefs.ErrInvalidArgument)
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

// multiFlag is a flag that may be repeated.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }
