package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// -h and --help print a command's usage and succeed; a bad flag is a
// usage error (2); version prints the build.
func TestHelpAndVersion(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string // in stdout or stderr
	}{
		{[]string{"--help"}, 0, "Usage:"},
		{[]string{"run", "--help"}, 0, "-agent"},
		{[]string{"tasks", "-h"}, 0, "-status"},
		{[]string{"serve", "--help"}, 0, "-listen"},
		{[]string{"ws", "ls", "--help"}, 0, "-json"},
		{[]string{"tasks", "--bogus"}, 2, "bogus"},
		{[]string{"version"}, 0, "corral "},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), tc.args, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stdout.String()+stderr.String(), tc.out) {
			t.Errorf("corral %s: exit %d, want %d; output %q, want %q in it", strings.Join(tc.args, " "), code, tc.code, stdout.String()+stderr.String(), tc.out)
		}
	}
}
