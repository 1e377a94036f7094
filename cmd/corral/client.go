package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/termsafe"
)

// clientFlags are the flags every client command takes: where the server
// and the configuration are, and --json. The server's own flags (--listen,
// --data, --runtime, --max-concurrent) are not among them: a client
// command that took them could only ignore them.
type clientFlags struct {
	lo     config.LoadOptions
	server string
	json   bool
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	c.lo.RegisterClientFlags(fs)
	fs.StringVar(&c.server, "server", "", "the server's URL (default http:// and the configured listen address)")
	fs.BoolVar(&c.json, "json", false, "print JSON")
}

// subcommand splits the arguments of a command with subcommands (corral
// workspaces, sessions, skills) into its subcommand, "ls" when they name
// none, and the rest, and returns the subcommand's flag set with the
// client flags registered.
func subcommand(command string, args []string, stderr io.Writer) (sub string, rest []string, fs *flag.FlagSet, cf *clientFlags) {
	sub = "ls"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		sub, args = args[0], args[1:]
	}
	fs, cf = clientFlagSet(command+" "+sub, stderr)
	return sub, args, fs, cf
}

// clientFlagSet returns the flag set of a client command called name,
// writing to stderr, with the client flags registered.
func clientFlagSet(name string, stderr io.Writer) (*flag.FlagSet, *clientFlags) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	cf := &clientFlags{}
	cf.register(fs)
	return fs, cf
}

// parse parses args with fs and returns the positional arguments and a
// client for the configured server.
func (c *clientFlags) parse(fs *flag.FlagSet, args []string) ([]string, *httpapi.Client, error) {
	pos, err := parse(fs, args)
	if err != nil {
		return nil, nil, flagError(err)
	}
	cl, err := c.client()
	return pos, cl, err
}

// parseTaskID parses the arguments of a command that takes one task id,
// and returns it and a client for the configured server.
func (c *clientFlags) parseTaskID(fs *flag.FlagSet, args []string) (string, *httpapi.Client, error) {
	pos, err := parse(fs, args)
	if err != nil {
		return "", nil, flagError(err)
	}
	if len(pos) != 1 {
		return "", nil, fmt.Errorf("give one task id: %w", errdefs.ErrInvalidArgument)
	}
	cl, err := c.client()
	return pos[0], cl, err
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
	return httpapi.NewClient(url, secrets.APIToken), nil
}

// reconnecting tells a person following a task that the stream lost the
// server and is trying to reach it again.
func reconnecting(w io.Writer) func(error) {
	return func(cause error) {
		fmt.Fprintf(w, "corral: lost the server (%s); reconnecting for up to %s\n", oneLine(errdefs.Message(cause), 120), httpapi.DefaultReconnect)
	}
}

// parse parses args allowing flags after positional arguments, and returns
// the positional ones (everything after "--" stays positional).
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
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
