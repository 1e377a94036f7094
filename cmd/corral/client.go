package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/termsafe"
)

// clientFlags are the flags every client command takes: where the server
// and the configuration are. The server's own flags (--listen, --data,
// --runtime, --max-concurrent) are not among them: a client command that
// took them could only ignore them.
type clientFlags struct {
	lo     config.LoadOptions
	server string
	// url is the server's, once client has made a client for it.
	url string
}

// clientCmd registers the client flags on cmd and returns them.
func clientCmd(cmd *cobra.Command) *clientFlags {
	cf := &clientFlags{}
	gfs := flag.NewFlagSet(cmd.Name(), flag.ContinueOnError)
	cf.lo.RegisterClientFlags(gfs)
	cmd.Flags().AddGoFlagSet(gfs)
	cmd.Flags().StringVar(&cf.server, "server", "", "the server's URL (default http:// and the configured listen address)")
	return cf
}

// client returns an API client for the configured server.
func (c *clientFlags) client() (*httpapi.Client, error) {
	cfg, err := config.Load(c.lo)
	if err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	secrets, err := cfg.Secrets()
	if err != nil {
		return nil, err
	}
	url := c.server
	if url == "" {
		host, port, _ := net.SplitHostPort(cfg.Listen)
		if host == "" || host == "0.0.0.0" || host == "::" {
			host = "127.0.0.1"
		}
		url = "http://" + net.JoinHostPort(host, port)
	}
	c.url = url
	return httpapi.NewClient(url, secrets.APIToken), nil
}

// The output formats of -o. Every command that prints an object takes
// json and yaml; lists and gets take wide and name too.
const (
	formatTable = ""
	formatJSON  = "json"
	formatYAML  = "yaml"
	formatWide  = "wide"
	formatName  = "name"
	// formatQuiet is -q's: the ids alone. It is no value of -o.
	formatQuiet = "quiet"
)

var (
	objectFormats = []string{formatJSON, formatYAML}
	listFormats   = []string{formatJSON, formatYAML, formatWide, formatName}
)

// output is how a command prints what it got: -o FORMAT, and --json, kept
// as the same as -o json for the scripts that use it.
type output struct {
	format  string
	json    bool
	formats []string
}

// outputFlags registers -o (with the formats the command prints) and
// --json on cmd.
func outputFlags(cmd *cobra.Command, formats []string) *output {
	o := &output{formats: formats}
	cmd.Flags().StringVarP(&o.format, "output", "o", "", "print the answer as "+strings.Join(formats, ", ")+" (default: for people)")
	cmd.Flags().BoolVar(&o.json, "json", false, "same as -o json")
	cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions(formats, cobra.ShellCompDirectiveNoFileComp))
	return o
}

// get returns the format asked for, refusing one the command does not
// print.
func (o *output) get() (string, error) {
	if o.json {
		if o.format != "" && o.format != formatJSON {
			return "", usagef("--json and -o %s contradict each other", o.format)
		}
		return formatJSON, nil
	}
	if o.format != "" && !slices.Contains(o.formats, o.format) {
		return "", usagef("-o %q: want one of %s", o.format, strings.Join(o.formats, ", "))
	}
	return o.format, nil
}

// print writes v as JSON or YAML when the format says so, and otherwise
// calls text.
func (o *output) print(w io.Writer, v any, text func() error) error {
	format, err := o.get()
	if err != nil {
		return err
	}
	return printAs(w, format, v, text)
}

// printAs writes v in format, calling text for the others.
func printAs(w io.Writer, format string, v any, text func() error) error {
	switch format {
	case formatJSON:
		return printJSON(w, v)
	case formatYAML:
		return printYAML(w, v)
	}
	return text()
}

// printJSON writes v as indented JSON. encoding/json escapes the control
// characters below 0x20 but leaves DEL, the C1 controls and the bidi
// overrides raw, which a terminal may act on: those are escaped too, as
// the same characters in JSON's own \u notation.
func printJSON(w io.Writer, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := w.Write(termsafe.JSON(buf.Bytes()))
	return err
}

// printYAML writes v as YAML with the fields JSON has, in the same order.
// A string a terminal could act on is written double-quoted, where YAML
// escapes its controls, and the characters YAML leaves raw there (DEL
// aside, the bidi overrides and line separators count as printable to it)
// are written as the same characters in \u notation, which means the same
// inside double quotes.
func printYAML(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	// JSON is YAML; YAML refuses the raw C1 controls JSON leaves, but
	// reads them in \u notation.
	var doc yaml.Node
	if err := yaml.Unmarshal(termsafe.JSON(b), &doc); err != nil {
		return err
	}
	plainStyle(&doc)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return err
	}
	enc.Close()
	_, err = w.Write(termsafe.JSON(buf.Bytes()))
	return err
}

// plainStyle drops the JSON styles of a document parsed from JSON (flow
// mappings, every string quoted) for YAML's block style, keeping double
// quotes where a string holds a character a terminal could act on.
func plainStyle(n *yaml.Node) {
	n.Style = 0
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" && termsafe.Text(n.Value) != n.Value {
		n.Style = yaml.DoubleQuotedStyle
	}
	for _, c := range n.Content {
		plainStyle(c)
	}
}

// table writes rows under a header, aligned; with wide, the columns past
// narrow are written too.
func table(w io.Writer, header []string, narrow int, wide bool, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	cut := func(r []string) []string {
		if wide || len(r) <= narrow {
			return r
		}
		return r[:narrow]
	}
	if header != nil {
		fmt.Fprintln(tw, strings.Join(cut(header), "\t"))
	}
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(cut(r), "\t"))
	}
	return tw.Flush()
}

// cell is a name for a table's cell: as termsafe.Name shows it, and
// empty when there is none.
func cell(s string) string {
	if s == "" {
		return ""
	}
	return termsafe.Name(s)
}

// reconnecting tells a person following a task that the stream lost the
// server and is trying to reach it again.
func reconnecting(w io.Writer) func(error) {
	return func(cause error) {
		fmt.Fprintf(w, "corral: lost the server (%s); reconnecting for up to %s\n", oneLine(errdefs.Message(cause), 120), httpapi.DefaultReconnect)
	}
}

// oneLine is s on one line: its runs of white space made one space, cut to
// n characters, and anything a terminal could act on escaped.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) > n {
		cut := 0
		for range n - 1 {
			_, size := utf8.DecodeRuneInString(s[cut:])
			cut += size
		}
		s = s[:cut] + "…"
	}
	return termsafe.Line(s)
}
