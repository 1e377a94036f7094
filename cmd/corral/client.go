package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/httpapi"
)

// clientFlags are the flags every client command takes.
type clientFlags struct {
	lo     config.LoadOptions
	server string
	json   bool
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	c.lo.RegisterFlags(fs)
	fs.StringVar(&c.server, "server", "", "the server's URL (default http:// and the configured listen address)")
	fs.BoolVar(&c.json, "json", false, "print JSON")
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

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n-1] + "…"
	}
	return s
}
