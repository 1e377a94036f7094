package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/termsafe"
)

// cmdWorkspaces is corral workspaces [ls] | ls NAME [PATH] | create NAME
// [--git] | cat NAME PATH: the named workspaces under projects/.
func cmdWorkspaces(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	sub, args, fs, cf := subcommand("workspaces", args, stderr)
	git := fs.Bool("git", false, "create: git init with an empty first commit")
	recursive := fs.Bool("r", false, "ls NAME: everything below the directory")
	pos, c, err := cf.parse(fs, args)
	if err != nil {
		return err
	}
	switch {
	case sub == "ls" && len(pos) == 0:
		ps, err := c.ListProjects(ctx)
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(stdout, ps)
		}
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "WORKSPACE\tGIT\tMODIFIED")
		for _, p := range ps {
			fmt.Fprintf(tw, "%s\t%v\t%s\n", termsafe.Name(p.Name), p.Git, p.Modified.Local().Format("2006-01-02 15:04"))
		}
		return tw.Flush()
	case sub == "ls" && len(pos) <= 2:
		p := "."
		if len(pos) == 2 {
			p = pos[1]
		}
		ents, err := c.ListProjectFiles(ctx, pos[0], p, *recursive)
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(stdout, ents)
		}
		for _, e := range ents {
			fmt.Fprintf(stdout, "%s\t%d\n", termsafe.Name(e.Path), e.Size)
		}
		return nil
	case sub == "create" && len(pos) == 1:
		p, err := c.CreateProject(ctx, service.CreateProjectRequest{Name: pos[0], InitGit: *git})
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(stdout, p)
		}
		fmt.Fprintf(stdout, "%s (git: %v)\n", termsafe.Name(p.Name), p.Git)
		return nil
	case sub == "cat" && len(pos) == 2:
		f, err := c.ReadProjectFile(ctx, pos[0], pos[1])
		if err != nil {
			return err
		}
		w := termsafe.ForTerminal(stdout)
		defer w.Close()
		if f.Encoding == "base64" {
			return fmt.Errorf("%s is binary; read it through the API: %w", termsafe.Name(pos[1]), errdefs.ErrInvalidArgument)
		}
		_, err = io.WriteString(w, f.Content)
		return err
	}
	return fmt.Errorf("usage: corral workspaces [ls] | ls NAME [PATH] [-r] | create NAME [--git] | cat NAME PATH: %w", errdefs.ErrInvalidArgument)
}
