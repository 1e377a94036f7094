package main

import (
	"fmt"
	"io"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/termsafe"
)

// workspacesCmd is corral workspaces [ls] | ls NAME [PATH] | create NAME
// [--git] | cat NAME PATH: the named workspaces under projects/.
func workspacesCmd() *cobra.Command {
	cmd := workspacesLsCmd("workspaces")
	cmd.Short = "The named workspaces under projects/: list them (ls NAME [PATH], create NAME, cat NAME PATH)"
	ls := workspacesLsCmd("ls [NAME [PATH]]")
	ls.Aliases = []string{"list"}
	cmd.AddCommand(ls, workspacesCreateCmd(), workspacesCatCmd())
	return cmd
}

// projectsLister prints the named workspaces.
var projectsLister = lister[service.Project]{
	kind:   "workspace",
	header: []string{"WORKSPACE", "GIT", "MODIFIED"},
	narrow: 3,
	row: func(p service.Project) []string {
		return []string{termsafe.Name(p.Name), strconv.FormatBool(p.Git), p.Modified.Local().Format("2006-01-02 15:04")}
	},
	id:      func(p service.Project) string { return termsafe.Name(p.Name) },
	version: func(p service.Project) string { return p.Modified.String() },
}

// workspacesLsCmd lists the workspaces, or with NAME the files of one.
func workspacesLsCmd(use string) *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:   use,
		Short: "List the workspaces, or with NAME the files of one",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 2 || (cmd.Name() == "workspaces" && len(args) > 0) {
				return usagef("unexpected argument %q: corral workspaces ls [NAME [PATH]]", args[len(args)-1])
			}
			return nil
		},
	}
	cf := clientCmd(cmd)
	lf := addListFlags(cmd, false)
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "ls NAME: everything below the directory")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		ctx, stdout := cmd.Context(), cmd.OutOrStdout()
		if len(args) == 0 {
			ps, err := c.ListProjects(ctx)
			if err != nil {
				return err
			}
			return projectsLister.run(ctx, stdout, lf, ps, ps, func() ([]service.Project, error) { return c.ListProjects(ctx) })
		}
		p := "."
		if len(args) == 2 {
			p = args[1]
		}
		ents, err := c.ListProjectFiles(ctx, args[0], p, recursive)
		if err != nil {
			return err
		}
		format, err := lf.out.get()
		if err != nil {
			return err
		}
		return printAs(stdout, format, ents, func() error {
			for _, e := range ents {
				fmt.Fprintf(stdout, "%s\t%d\n", termsafe.Name(e.Path), e.Size)
			}
			return nil
		})
	}
	return cmd
}

func workspacesCreateCmd() *cobra.Command {
	var git bool
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Make a named workspace",
		Args:  exactArgs(1, "the workspace's name"),
	}
	cf := clientCmd(cmd)
	out := outputFlags(cmd, objectFormats)
	cmd.Flags().BoolVar(&git, "git", false, "git init with an empty first commit")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		p, err := c.CreateProject(cmd.Context(), service.CreateProjectRequest{Name: args[0], InitGit: git})
		if err != nil {
			return err
		}
		return out.print(cmd.OutOrStdout(), p, func() error {
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s (git: %v)\n", termsafe.Name(p.Name), p.Git)
			return err
		})
	}
	return cmd
}

func workspacesCatCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cat NAME PATH",
		Short: "Print a file of a named workspace",
		Args:  exactArgs(2, "the workspace's name and the file's path"),
	}
	cf := clientCmd(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		return catProjectFile(cmd, c, args[0], args[1])
	}
	return cmd
}

func catProjectFile(cmd *cobra.Command, c *httpapi.Client, name, path string) error {
	f, err := c.ReadProjectFile(cmd.Context(), name, path)
	if err != nil {
		return err
	}
	if f.Encoding == "base64" {
		return fmt.Errorf("%s is binary; read it through the API: %w", termsafe.Name(path), errdefs.ErrInvalidArgument)
	}
	w := termsafe.ForTerminal(cmd.OutOrStdout())
	_, err = io.WriteString(w, f.Content)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	return err
}
