package statedir_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/statedir"
)

// TestExplain gives a failed main process the signal that ended it or its
// last words from the end of output.log, however long the log.
func TestExplain(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("noise\n", 100<<10) + "panic: boom\n\ngoroutine 1 [running]:\n"
	if err := os.WriteFile(filepath.Join(dir, "output.log"), []byte(long), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		es   sandbox.ExitStatus
		dir  string
		want string
	}{
		{"last words", sandbox.ExitStatus{Code: 2}, dir, "panic: boom"},
		{"signal", sandbox.ExitStatus{Code: 137}, dir, "killed by SIGKILL (signal 9)"},
		{"message kept", sandbox.ExitStatus{Code: 2, Message: "OOMKilled"}, dir, "OOMKilled"},
		{"success", sandbox.ExitStatus{Code: 0}, dir, ""},
		{"no output.log", sandbox.ExitStatus{Code: 2}, t.TempDir(), ""},
	} {
		es := tc.es
		statedir.Explain(&es, tc.dir)
		if es.Message != tc.want {
			t.Errorf("%s: Message = %q, want %q", tc.name, es.Message, tc.want)
		}
	}
}
