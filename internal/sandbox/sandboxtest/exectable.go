package sandboxtest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Exec runs argv in dir with env and stdin added, streaming its output to
// stdout and stderr, and returns its exit code: a runtime's Exec, or a
// session's exec agent, made alike for ExecTable.
type Exec func(ctx context.Context, argv []string, dir string, env []string, stdin io.Reader, stdout, stderr io.Writer) (int, error)

// ExecTable runs the one table of exec cases every way of running a
// command in a sandbox answers alike: the exit code and both streams
// apart, stdin, the environment and the working directory; a megabyte of
// output and bytes that are not UTF-8, intact; a command that is not there
// (127, or 126), and one that exits 128 itself; a context that ends (the command is stopped, and the error is the
// context's). dir is where the commands run, hostDir the same directory as
// this process sees it.
func ExecTable(t *testing.T, exec Exec, dir, hostDir string) {
	ctx := context.Background()
	run := func(t *testing.T, ctx context.Context, argv []string, env []string, stdin string) (int, string, string, error) {
		t.Helper()
		var stdout, stderr bytes.Buffer
		code, err := exec(ctx, argv, dir, env, strings.NewReader(stdin), &stdout, &stderr)
		return code, stdout.String(), stderr.String(), err
	}
	t.Run("code, streams, stdin, env, cwd", func(t *testing.T) {
		code, out, errs, err := run(t, ctx, []string{Shell, "-c", `read line; echo "$line $GREETING" > exec-out; echo out; echo err >&2; exit 3`},
			[]string{"GREETING=world"}, "hello\n")
		if err != nil || code != 3 || out != "out\n" || errs != "err\n" {
			t.Errorf("code %d, stdout %q, stderr %q, %v; want 3, %q, %q", code, out, errs, err, "out\n", "err\n")
		}
		if got, _ := os.ReadFile(filepath.Join(hostDir, "exec-out")); string(got) != "hello world\n" {
			t.Errorf("the command wrote %q, want %q", got, "hello world\n")
		}
	})
	t.Run("a megabyte of output", func(t *testing.T) {
		code, out, _, err := run(t, ctx, []string{Shell, "-c", `head -c 1048576 /dev/zero | tr '\0' a`}, nil, "")
		if err != nil || code != 0 || len(out) != 1<<20 || strings.Trim(out, "a") != "" {
			t.Errorf("code %d, %d bytes of stdout (all a: %v), %v; want 0 and 1 MiB of a", code, len(out), strings.Trim(out, "a") == "", err)
		}
	})
	t.Run("bytes that are not UTF-8", func(t *testing.T) {
		code, out, _, err := run(t, ctx, []string{Shell, "-c", `printf '\377\000\001\n'`}, nil, "")
		if err != nil || code != 0 || out != "\xff\x00\x01\n" {
			t.Errorf("code %d, stdout %q, %v; want 0, %q", code, out, err, "\xff\x00\x01\n")
		}
	})
	t.Run("not there", func(t *testing.T) {
		// 127 as a shell says it; the Docker engine says 126 for any
		// command its runtime could not start.
		code, _, _, err := run(t, ctx, []string{"/nonexistent/command"}, nil, "")
		if code != 127 && code != 126 || err != nil && !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("code %d, %v; want 127 or 126 (and no error, or one saying why)", code, err)
		}
	})
	t.Run("its own 128", func(t *testing.T) {
		if code, _, _, err := run(t, ctx, []string{Shell, "-c", "exit 128"}, nil, ""); err != nil || code != 128 {
			t.Errorf("code %d, %v; want 128, the command's", code, err)
		}
	})
	t.Run("context ends", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, _, _, err := run(t, ctx, []string{Shell, "-c", "sleep 100"}, nil, "")
		if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 30*time.Second {
			t.Errorf("%v after %v; want context.DeadlineExceeded, soon", err, time.Since(start))
		}
	})
}
