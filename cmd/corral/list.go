package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"
)

// watchInterval is how often --watch asks the server again.
var watchInterval = 2 * time.Second

// listFlags are the flags of a list: -o, -q, and --watch for a list
// that changes on its own (tasks, sessions).
type listFlags struct {
	out   *output
	quiet bool
	watch bool
}

func addListFlags(cmd *cobra.Command, watch bool) *listFlags {
	l := &listFlags{out: outputFlags(cmd, listFormats)}
	cmd.Flags().BoolVarP(&l.quiet, "quiet", "q", false, "print the ids only")
	if watch {
		cmd.Flags().BoolVarP(&l.watch, "watch", "w", false, "after the list, print each item again when it changes, until interrupted")
	}
	return l
}

// format returns the format to print in: -q is -o name's ids without
// their kind.
func (l *listFlags) format() (string, error) {
	f, err := l.out.get()
	if err == nil && l.quiet {
		if f != formatTable {
			return "", usagef("-q and -o %s contradict each other", f)
		}
		f = formatQuiet
	}
	return f, err
}

// lister prints the items of one list: their rows and names.
type lister[T any] struct {
	kind   string // in -o name: KIND/ID
	header []string
	narrow int // the columns without -o wide
	row    func(T) []string
	id     func(T) string
	// version changes whenever an item does, for --watch.
	version func(T) string
}

// print writes items in format; the table's header unless noHeader.
func (ls lister[T]) print(w io.Writer, format string, items []T, noHeader bool) error {
	switch format {
	case formatQuiet, formatName:
		for _, it := range items {
			if format == formatName {
				fmt.Fprint(w, ls.kind, "/")
			}
			fmt.Fprintln(w, ls.id(it))
		}
		return nil
	case formatJSON, formatYAML:
		// A stream of documents (--watch): YAML's are each opened with
		// ---, JSON's follow each other.
		for _, it := range items {
			if format == formatYAML {
				fmt.Fprintln(w, "---")
			}
			if err := printAs(w, format, it, nil); err != nil {
				return err
			}
		}
		return nil
	}
	rows := make([][]string, len(items))
	for i, it := range items {
		rows[i] = ls.row(it)
	}
	header := ls.header
	if noHeader {
		header = nil
	}
	return table(w, header, ls.narrow, format == formatWide, rows)
}

// get prints one item in format.
func (ls lister[T]) get(w io.Writer, format string, it T) error {
	return printAs(w, format, it, func() error { return ls.print(w, format, []T{it}, false) })
}

// watch prints, every watchInterval until ctx ends, the items of list
// that changed since the last time, oldest first (lists are newest first).
func (ls lister[T]) watch(ctx context.Context, w io.Writer, format string, seen map[string]string, list func() ([]T, error)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(watchInterval):
		}
		items, err := list()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		var changed []T
		for _, it := range slices.Backward(items) {
			if v := ls.version(it); seen[ls.id(it)] != v {
				seen[ls.id(it)] = v
				changed = append(changed, it)
			}
		}
		if err := ls.print(w, format, changed, true); err != nil {
			return err
		}
	}
}

// run prints a list, and with --watch its changes after it.
func (ls lister[T]) run(ctx context.Context, w io.Writer, l *listFlags, whole any, items []T, list func() ([]T, error)) error {
	format, err := l.format()
	if err != nil {
		return err
	}
	if !l.watch {
		// A list as JSON or YAML is the API's answer, whole.
		return printAs(w, format, whole, func() error { return ls.print(w, format, items, false) })
	}
	if err := ls.print(w, format, items, false); err != nil {
		return err
	}
	seen := map[string]string{}
	for _, it := range items {
		seen[ls.id(it)] = ls.version(it)
	}
	return ls.watch(ctx, w, format, seen, list)
}
