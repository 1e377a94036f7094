package main

import (
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/corral-dev/corral/internal/termsafe"
	"github.com/corral-dev/corral/internal/tools"
	"github.com/corral-dev/corral/internal/workspace"
)

// wsCmd is corral ws: the shared workspace.
func wsCmd() *cobra.Command {
	return groupCmd("ws", "The shared workspace: ls [PATH], cat PATH, put PATH [FILE]", wsLsCmd(), wsCatCmd(), wsPutCmd())
}

// wsLister prints the entries of the shared workspace.
var wsLister = lister[workspace.Entry]{
	kind:   "file",
	header: []string{"PATH", "SIZE", "MODIFIED"},
	narrow: 3,
	row: func(e workspace.Entry) []string {
		name := e.Path
		if e.IsDir {
			name += "/"
		}
		return []string{termsafe.Name(name), strconv.FormatInt(e.Size, 10), e.Modified.Local().Format("2006-01-02 15:04")}
	},
	id: func(e workspace.Entry) string { return termsafe.Name(e.Path) },
}

func wsLsCmd() *cobra.Command {
	var recursive bool
	cmd := &cobra.Command{
		Use:     "ls [PATH]",
		Aliases: []string{"list"},
		Short:   "List a directory of the shared workspace",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usagef("unexpected argument %q: corral ws ls [PATH]", args[1])
			}
			return nil
		},
	}
	cf := clientCmd(cmd)
	lf := addListFlags(cmd, false)
	cmd.Flags().BoolVarP(&recursive, "recursive", "r", false, "list recursively")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		p := ""
		if len(args) > 0 {
			p = args[0]
		}
		ents, err := c.ListWorkspace(cmd.Context(), p, recursive)
		if err != nil {
			return err
		}
		return wsLister.run(cmd.Context(), cmd.OutOrStdout(), lf, ents, ents, nil)
	}
	return cmd
}

func wsCatCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cat PATH",
		Short: "Print a file of the shared workspace: its exact bytes, control characters escaped if stdout is a terminal",
		Args:  exactArgs(1, "one path: corral ws cat PATH"),
	}
	cf := clientCmd(cmd)
	out := outputFlags(cmd, objectFormats)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		format, err := out.get()
		if err != nil {
			return err
		}
		c, err := cf.client()
		if err != nil {
			return err
		}
		f, err := c.ReadWorkspace(cmd.Context(), args[0])
		if err != nil {
			return err
		}
		stdout := cmd.OutOrStdout()
		return printAs(stdout, format, f, func() error {
			b := []byte(f.Content)
			if f.Encoding == "base64" {
				if b, err = base64.StdEncoding.DecodeString(f.Content); err != nil {
					return err
				}
			}
			w := termsafe.ForTerminal(stdout)
			_, err = w.Write(b)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			if f.Truncated {
				fmt.Fprintf(cmd.ErrOrStderr(), "corral ws cat: %s\n", termsafe.Line(f.Note))
			}
			return err
		})
	}
	return cmd
}

func wsPutCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "put PATH [FILE]",
		Short: "Write a file of the shared workspace from FILE (- or absent: stdin)",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 || len(args) > 2 {
				return usagef("give the path, then the file: corral ws put PATH [FILE]")
			}
			return nil
		},
	}
	cf := clientCmd(cmd)
	out := outputFlags(cmd, objectFormats)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		var (
			data []byte
			err  error
		)
		if len(args) == 2 && args[1] != "-" {
			if data, err = os.ReadFile(args[1]); err != nil {
				err = fileError("read", args[1], err)
			}
		} else {
			data, err = io.ReadAll(os.Stdin)
		}
		if err != nil {
			return err
		}
		c, err := cf.client()
		if err != nil {
			return err
		}
		e, err := c.WriteWorkspace(cmd.Context(), args[0], data)
		if err != nil {
			return err
		}
		return out.print(cmd.OutOrStdout(), e, func() error {
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (%d bytes)\n", termsafe.Name("shared/"+e.Path), e.Size)
			return err
		})
	}
	return cmd
}

// toolsLister prints the tool catalogue.
var toolsLister = lister[tools.Function]{
	kind:   "tool",
	header: []string{"TOOL", "DESCRIPTION"},
	narrow: 2,
	row: func(d tools.Function) []string {
		return []string{termsafe.Name(d.Function.Name), oneLine(d.Function.Description, 90)}
	},
	id: func(d tools.Function) string { return termsafe.Name(d.Function.Name) },
}

func toolsCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "tools", Short: "The tool catalogue as function definitions", Args: noArgs}
	cf := clientCmd(cmd)
	lf := addListFlags(cmd, false)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		defs, err := c.Tools(cmd.Context())
		if err != nil {
			return err
		}
		return toolsLister.run(cmd.Context(), cmd.OutOrStdout(), lf, defs, defs, nil)
	}
	return cmd
}
