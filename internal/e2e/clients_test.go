//go:build integration

package e2e_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/testenv"
)

// TestClients runs the suites of the Python and TypeScript clients
// (clients/) against a real server with the local runtime and an API
// token, which they read from CORRAL_URL and CORRAL_API_TOKEN as their
// users' programs do.
func TestClients(t *testing.T) {
	t.Parallel()
	const token = "clients-test-token-0123456789"
	s := MustStartEnv(t, []string{"CORRAL_API_TOKEN=" + token}, nil)
	root, err := filepath.Abs(filepath.Join("..", "..", "clients"))
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "CORRAL_URL="+s.url, "CORRAL_API_TOKEN="+token)
	run := func(t *testing.T, dir string, argv ...string) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Dir = dir
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		t.Logf("%v:\n%s", argv, out)
		if err != nil {
			t.Fatalf("%v in %s: %v", argv, dir, err)
		}
	}
	t.Run("python", func(t *testing.T) {
		testenv.RequireBinary(t, "python3", "apt-get install -y python3")
		run(t, filepath.Join(root, "python"), "python3", "-m", "unittest", "-v")
	})
	t.Run("typescript", func(t *testing.T) {
		testenv.RequireBinary(t, "npm", "apt-get install -y nodejs npm")
		dir := filepath.Join(root, "typescript")
		if _, err := os.Stat(filepath.Join(dir, "node_modules", "typescript", "package.json")); err != nil {
			testenv.Missing(t, "TypeScript in clients/typescript/node_modules (run: npm ci --prefix clients/typescript)")
		}
		run(t, dir, "npm", "test", "--silent")
	})
}
