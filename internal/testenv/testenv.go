// Package testenv gates tests on the real parts they need (root, bubblewrap,
// runsc, Docker, a kube-apiserver, PostgreSQL). Outside CI a missing part
// skips the test; in CI (CI=true) it fails it, so a gate never hides a
// missing install step there.
package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// InCI reports whether the tests run in CI, where every part must be present.
func InCI() bool { return os.Getenv("CI") == "true" }

// Missing skips tb (or fails it in CI) because what is missing.
func Missing(tb testing.TB, what string) {
	tb.Helper()
	if InCI() {
		tb.Fatalf("missing in CI: %s", what)
	}
	tb.Skipf("skipped: %s", what)
}

// RequireRoot needs the test to run as root.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		Missing(tb, "needs root")
	}
}

// RequireBinary needs name on PATH and returns its path.
func RequireBinary(tb testing.TB, name, install string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(tb, name+" not found on PATH (install: "+install+")")
	}
	return p
}

// RequireBwrap needs root and bubblewrap, and returns bwrap's path.
func RequireBwrap(tb testing.TB) string {
	tb.Helper()
	RequireRoot(tb)
	return RequireBinary(tb, "bwrap", "apt-get install -y bubblewrap")
}

// RequireRunsc needs root and gVisor's runsc, and returns runsc's path.
func RequireRunsc(tb testing.TB) string {
	tb.Helper()
	RequireRoot(tb)
	return RequireBinary(tb, "runsc", "apt-get install -y runsc")
}
