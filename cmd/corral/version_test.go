package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/corral-dev/corral/internal/version"
)

// A release's version (stamped at link time by scripts/release.sh) is what
// corral version prints and what corral k8s render's default server image
// is tagged with, as scripts/release.sh tags the image.
func TestStampedVersion(t *testing.T) {
	defer func(v string) { version.Version = v }(version.Version)
	version.Version = "0a1b2c3-dirty"
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"version"}, &stdout, &stderr); code != 0 || stdout.String() != "corral 0a1b2c3-dirty\n" {
		t.Errorf("corral version: exit %d, %q (stderr %q)", code, stdout.String(), stderr.String())
	}
	if img := defaultServerImage(); img != "corral:0a1b2c3-dirty" {
		t.Errorf("default server image %q, want corral:0a1b2c3-dirty", img)
	}
}
