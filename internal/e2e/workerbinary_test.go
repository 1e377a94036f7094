//go:build integration

package e2e_test

import (
	"context"
	"debug/buildinfo"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/app"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestWorkerBinaryFromTheSameBuild: sandboxes run corral-worker from
// beside the corral binary, and the server refuses to start without it
// or with one of another build, saying which.
func TestWorkerBinaryFromTheSameBuild(t *testing.T) {
	t.Parallel()
	dir := testenv.TempDir(t)
	corral := filepath.Join(dir, "corral")
	worker := filepath.Join(dir, "corral-worker")
	mustCopy(t, corralBin, corral)
	start := func() error {
		t.Helper()
		cfg := testConfig(t, []string{}, testenv.TempDir(t))
		a, err := app.New(context.Background(), cfg, slog.New(slog.NewTextHandler(testWriter{t}, nil)), app.Options{Binary: corral})
		if err == nil {
			a.Close()
			for _, name := range []string{"corral", "corral-worker"} {
				if _, err := os.Stat(filepath.Join(cfg.Data, "run", "bin", name)); err != nil {
					t.Errorf("%s not staged in the data root: %v", name, err)
				}
			}
		}
		return err
	}
	refused := func(what, want string) {
		t.Helper()
		if err := start(); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: the server started with %v, want it refused with %q", what, err, want)
		}
	}
	refused("no corral-worker", "corral-worker is missing")

	// Another program under the name.
	mustCopy(t, corralBin, worker)
	refused("corral under corral-worker's name", "is not from the build")

	// corral-worker from the same source with other version control
	// information recorded, as a stale build beside a new corral has.
	bi, err := buildinfo.ReadFile(corralBin)
	if err != nil {
		t.Fatal(err)
	}
	vcs := "-buildvcs=true"
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			vcs = "-buildvcs=false"
		}
	}
	build := exec.Command("go", "build", vcs, "-o", worker, "github.com/corral-dev/corral/cmd/corral-worker")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", vcs, err, out)
	}
	refused("corral-worker of another build", "is not from the build")

	mustCopy(t, filepath.Join(filepath.Dir(corralBin), "corral-worker"), worker)
	if err := start(); err != nil {
		t.Errorf("corral-worker of the same build: %v", err)
	}
}

// mustCopy copies executable src to dst.
func mustCopy(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	os.Remove(dst)
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
