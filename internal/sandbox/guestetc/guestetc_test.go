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
