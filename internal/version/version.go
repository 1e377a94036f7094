// Package version is this binary's version: the one scripts/release.sh
// stamps at link time, or else what the Go toolchain recorded.
package version

import (
	"runtime/debug"
	"strings"
)

// Version is set at link time to `git describe --tags --always --dirty`
// of the release's commit (scripts/release.sh, deploy/Dockerfile):
//
//	-ldflags '-X github.com/corral-dev/corral/internal/version.Version=v1.2.0'
//
// Empty in a build that did not set it: String falls back then.
var Version string

// String is Version when it is set, else the module version when built
// from a tagged module, else "devel" with the commit, its time and
// whether the tree had changes, when known.
func String() string {
	if Version != "" {
		return Version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	if v == "" || v == "(devel)" {
		v = "devel"
	}
	var rev, at string
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	parts := []string{v}
	if rev != "" {
		parts = append(parts, rev[:min(12, len(rev))])
	}
	if at != "" {
		parts = append(parts, at)
	}
	if modified {
		parts = append(parts, "(modified)")
	}
	return strings.Join(parts, " ")
}

// Revision is the commit this binary was built from, as the Go toolchain
// recorded it; empty when unknown.
func Revision() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			return s.Value
		}
	}
	return ""
}
