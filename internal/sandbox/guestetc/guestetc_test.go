package guestetc

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etc")
	binds, err := Write(dir, Options{UID: 1234, GID: 5678})
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	var want []string
	for _, name := range HostBinds {
		if _, err := os.Stat(filepath.Join("/etc", name)); err == nil {
			want = append(want, name)
		}
	}
	if diff := cmp.Diff(want, binds); diff != "" {
		t.Errorf("binds (-want +got):\n%s", diff)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	wantNames := []string{"group", "hostname", "hosts", "nsswitch.conf", "passwd"}
	for _, name := range want {
		top, _, _ := strings.Cut(name, "/")
		if !slices.Contains(wantNames, top) {
			wantNames = append(wantNames, top)
		}
	}
	slices.Sort(wantNames)
	if diff := cmp.Diff(wantNames, got); diff != "" {
		t.Errorf("etc entries (-want +got):\n%s", diff)
	}
	passwd, _ := os.ReadFile(filepath.Join(dir, "passwd"))
	if !strings.Contains(string(passwd), "\nworker:x:1234:5678:worker:/tmp:/bin/sh\n") {
		t.Errorf("passwd has no worker 1234:5678:\n%s", passwd)
	}
	group, _ := os.ReadFile(filepath.Join(dir, "group"))
	if !strings.Contains(string(group), "\nworker:x:5678:\n") {
		t.Errorf("group has no worker 5678:\n%s", group)
	}
	for _, name := range want {
		fi, err := os.Stat(filepath.Join(dir, name))
		host, herr := os.Stat(filepath.Join("/etc", name))
		if err != nil || herr != nil || fi.IsDir() != host.IsDir() {
			t.Errorf("mount point %s: %v, %v; want the kind of the host entry", name, err, herr)
		}
	}
}

func TestWriteResolvConf(t *testing.T) {
	dir := t.TempDir()
	if _, err := Write(dir, Options{ResolvConf: true}); err != nil {
		t.Fatalf("Write: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "resolv.conf"))
	if err != nil || string(b) != ResolvConf {
		t.Errorf("resolv.conf = %q, %v; want ResolvConf", b, err)
	}
	// Writing again over an existing /etc (mount points exist) succeeds.
	if _, err := Write(dir, Options{ResolvConf: true}); err != nil {
		t.Errorf("second Write: %v", err)
	}
}

// A dir shared by sandboxes is written again at each start of a runtime:
// the files take the new content and no temporary file is left behind.
func TestWriteReplaces(t *testing.T) {
	dir := t.TempDir()
	if _, err := Write(dir, Options{UID: 1000, GID: 1000}); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadDir(dir)
	if _, err := Write(dir, Options{UID: 1234, GID: 5678}); err != nil {
		t.Fatal(err)
	}
	passwd, _ := os.ReadFile(filepath.Join(dir, "passwd"))
	if !strings.Contains(string(passwd), "\nworker:x:1234:5678:") {
		t.Errorf("passwd after the second Write:\n%s", passwd)
	}
	if fi, err := os.Stat(filepath.Join(dir, "passwd")); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("passwd: %v, %v; want mode 0644", fi, err)
	}
	after, _ := os.ReadDir(dir)
	if len(after) != len(before) {
		t.Errorf("entries %v after the second Write, %v before", after, before)
	}
}

// MountPoints makes again a mount point that is missing (a host entry that
// appeared after the dir was written), and keeps those that exist.
func TestMountPointsMakesMissing(t *testing.T) {
	dir := t.TempDir()
	binds, err := Write(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(binds) == 0 {
		t.Skip("no entry of HostBinds on this host")
	}
	if err := os.RemoveAll(filepath.Join(dir, binds[0])); err != nil {
		t.Fatal(err)
	}
	again, err := MountPoints(dir)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(binds, again); diff != "" {
		t.Errorf("MountPoints (-first +again):\n%s", diff)
	}
	fi, err := os.Stat(filepath.Join(dir, binds[0]))
	host, herr := os.Stat(filepath.Join("/etc", binds[0]))
	if err != nil || herr != nil || fi.IsDir() != host.IsDir() {
		t.Errorf("mount point %s: %v, %v; want the kind of the host entry", binds[0], err, herr)
	}
}
