package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/termsafe"
)

const wsUsage = "corral ws ls [PATH] [--recursive] | cat PATH | put PATH [FILE] (FILE - or absent: stdin); cat writes the exact bytes, control characters escaped if stdout is a terminal"

func cmdWorkspace(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: %s: %w", wsUsage, errdefs.ErrInvalidArgument)
	}
	if isHelp(args[0]) {
		fmt.Fprintln(stdout, "usage: "+wsUsage)
		return nil
	}
	fs, cf := clientFlagSet("ws "+args[0], stderr)
	recursive := fs.Bool("recursive", false, "list recursively (ls)")
	pos, err := parse(fs, args[1:])
	if err != nil {
		return flagError(err)
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	switch args[0] {
	case "ls":
		p := ""
		if len(pos) > 0 {
			p = pos[0]
		}
		ents, err := c.ListWorkspace(ctx, p, *recursive)
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(stdout, ents)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		for _, e := range ents {
			name := e.Path
			if e.IsDir {
				name += "/"
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\n", termsafe.Name(name), e.Size, e.Modified.Local().Format("2006-01-02 15:04"))
		}
		return tw.Flush()
	case "cat":
		if len(pos) != 1 {
			return fmt.Errorf("usage: corral ws cat PATH: %w", errdefs.ErrInvalidArgument)
		}
		f, err := c.ReadWorkspace(ctx, pos[0])
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(stdout, f)
		}
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
			fmt.Fprintf(stderr, "corral ws cat: %s\n", termsafe.Line(f.Note))
		}
		return err
	case "put":
		if len(pos) < 1 || len(pos) > 2 {
			return fmt.Errorf("usage: corral ws put PATH [FILE]: %w", errdefs.ErrInvalidArgument)
		}
		var data []byte
		if len(pos) == 2 && pos[1] != "-" {
			if data, err = os.ReadFile(pos[1]); err != nil {
				err = fileError("read", pos[1], err)
			}
		} else {
			data, err = io.ReadAll(os.Stdin)
		}
		if err != nil {
			return err
		}
		e, err := c.WriteWorkspace(ctx, pos[0], data)
		if err != nil {
			return err
		}
		if cf.json {
			return printJSON(stdout, e)
		}
		fmt.Fprintf(stdout, "wrote %s (%d bytes)\n", termsafe.Name("shared/"+e.Path), e.Size)
		return nil
	}
	return fmt.Errorf("unknown ws command %q; usage: %s: %w", args[0], wsUsage, errdefs.ErrInvalidArgument)
}

func cmdTools(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, cf := clientFlagSet("tools", stderr)
	if _, err := parse(fs, args); err != nil {
		return flagError(err)
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	defs, err := c.Tools(ctx)
	if err != nil {
		return err
	}
	if cf.json {
		return printJSON(stdout, defs)
	}
	for _, d := range defs {
		fmt.Fprintf(stdout, "%-20s %s\n", termsafe.Name(d.Function.Name), oneLine(d.Function.Description, 90))
	}
	return nil
}
