package hostuser

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/corral-dev/corral/internal/testenv"
)

func TestValidate(t *testing.T) {
	testenv.RequireRoot(t)
	defs := filepath.Join(t.TempDir(), "login.defs")
	if err := os.WriteFile(defs, []byte("UID_MIN 1000\nUID_MAX 60000\nGID_MIN 1000\nGID_MAX 60000\nSUB_UID_MIN 100000\nSUB_UID_MAX 600100000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id   Identity
		want string // "" valid, else a part of the error
	}{
		{Identity{Reserved, Reserved}, ""},
		{Identity{999, 999}, ""}, // a system user's range: a dedicated system user is fine
		{Identity{0, Reserved}, "host root"},
		{Identity{Reserved, 0}, "host root"},
		{Identity{1000, Reserved}, "uid 1000"},
		{Identity{Reserved, 60000}, "gid 60000"},
		{Identity{165536, Reserved}, "SUB_UID"},
		{Identity{-1, 5}, "ids are 0 to"},
	} {
		err := tc.id.Validate(defs)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want valid", tc.id, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want an error with %q", tc.id, err, tc.want)
		}
	}
}

func TestReach(t *testing.T) {
	testenv.RequireRoot(t)
	id := Identity{Reserved, Reserved}
	closed := t.TempDir() // in the test's own 0700 directory
	if err := id.Reach(closed, 0o1); err == nil || !strings.Contains(err.Error(), "closed to the sandbox identity") {
		t.Errorf("Reach through a 0700 directory = %v, want closed", err)
	}
	open := testenv.TempDir(t)
	if err := id.Reach(open, 0o5); err != nil {
		t.Errorf("Reach of an open directory: %v", err)
	}
	// Group search only, as the data root gives it.
	grp := filepath.Join(open, "grp")
	if err := os.Mkdir(grp, 0o710); err != nil {
		t.Fatal(err)
	}
	if err := id.Reach(grp, 0o1); err == nil {
		t.Errorf("Reach of a 0710 root:root directory succeeded")
	}
	if err := os.Chown(grp, 0, Reserved); err != nil {
		t.Fatal(err)
	}
	if err := id.Reach(grp, 0o1); err != nil {
		t.Errorf("Reach of a 0710 directory of the sandbox's group: %v", err)
	}
	if err := id.Reach(grp, 0o4); err == nil {
		t.Errorf("Reach to list a 0710 directory succeeded")
	}
}

// Give hands a tree to the identity; Reclaim takes it back with no
// set-id, sticky or group/other write bit left, special files removed,
// and a symbolic link's target untouched.
func TestGiveReclaim(t *testing.T) {
	testenv.RequireRoot(t)
	id := Identity{Reserved, Reserved}
	dir := t.TempDir()
	outside := filepath.Join(t.TempDir(), "outside")
	if err := os.WriteFile(outside, []byte("x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(outside, os.ModeSetuid|0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	trees, err := Give([]string{dir, filepath.Join(dir, "missing")}, id)
	if err != nil {
		t.Fatalf("Give: %v", err)
	}
	for _, p := range []string{dir, filepath.Join(dir, "sub")} {
		if owner(t, p) != Reserved {
			t.Errorf("%s owned by %d after Give", p, owner(t, p))
		}
	}
	// What a worker leaves.
	suid := filepath.Join(dir, "sub", "suid")
	if err := os.WriteFile(suid, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(suid, os.ModeSetuid|os.ModeSetgid|0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "sub"), os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{suid, filepath.Join(dir, "fifo"), filepath.Join(dir, "link")} {
		if err := os.Lchown(p, Reserved, Reserved); err != nil {
			t.Fatal(err)
		}
	}
	if err := Reclaim(trees); err != nil {
		t.Fatalf("Reclaim: %v", err)
	}
	for _, p := range []string{dir, filepath.Join(dir, "sub"), suid, filepath.Join(dir, "link")} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if owner(t, p) != 0 {
			t.Errorf("%s owned by %d after Reclaim, want 0", p, owner(t, p))
		}
		if fi.Mode()&os.ModeSymlink == 0 && fi.Mode()&unsafeBits != 0 {
			t.Errorf("%s: mode %v after Reclaim", p, fi.Mode())
		}
	}
	if _, err := os.Lstat(filepath.Join(dir, "fifo")); err == nil {
		t.Errorf("the FIFO survived Reclaim")
	}
	if fi, err := os.Stat(outside); err != nil || fi.Mode()&os.ModeSetuid == 0 {
		t.Errorf("Reclaim changed the link's target outside: %v %v", fi.Mode(), err)
	}
}

// A tree goes back to whoever owned its top before Give (a person's
// repository under an operator's workspace root, say): what the person
// owned and what the sandbox made. A third person's file in it is
// neither given nor taken: it stays theirs. A tree the sandbox identity
// held already, left by a server that died, goes to the server.
func TestReclaimGivesBackToTheOwner(t *testing.T) {
	testenv.RequireRoot(t)
	id := Identity{Reserved, Reserved}
	person, left := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(person, "main.go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(person, 0o751); err != nil {
		t.Fatal(err)
	}
	third := filepath.Join(person, "third.txt")
	if err := os.WriteFile(third, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	for p, uid := range map[string]int{person: 1000, filepath.Join(person, "main.go"): 1000, third: 1001, left: Reserved} {
		if err := os.Lchown(p, uid, uid); err != nil {
			t.Fatal(err)
		}
	}
	trees, err := Give([]string{person, left}, id)
	if err != nil {
		t.Fatal(err)
	}
	if got := owner(t, third); got != 1001 {
		t.Errorf("a third person's file given to the sandbox: owned by %d", got)
	}
	want := []Tree{{Dir: person, Owner: Identity{1000, 1000}, To: id}, {Dir: left, Owner: Identity{0, 0}, To: id}}
	got := slices.Clone(trees)
	for i := range got {
		got[i].Dev, got[i].Ino, got[i].Mode = 0, 0, 0
	}
	// Closed to all but the sandbox while it is the sandbox's.
	for _, p := range []string{person, left} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s after Give: %v %v, want 0700", p, fi.Mode(), err)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Give = %+v, want %+v", got, want)
	}
	// What a worker writes there is the person's afterwards.
	if err := os.WriteFile(filepath.Join(person, "new.txt"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(filepath.Join(person, "new.txt"), Reserved, Reserved); err != nil {
		t.Fatal(err)
	}
	if err := Reclaim(trees); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(person); err != nil || fi.Mode().Perm() != 0o751 {
		t.Errorf("the person's top after Reclaim: %v %v, want its 0751 back", fi.Mode(), err)
	}
	for p, uid := range map[string]uint32{person: 1000, filepath.Join(person, "main.go"): 1000, filepath.Join(person, "new.txt"): 1000, third: 1001, left: 0} {
		if got := owner(t, p); got != uid {
			t.Errorf("%s owned by %d after Reclaim, want %d", p, got, uid)
		}
	}
}

// State written before trees had owners lists bare directories: the
// server's.
func TestTreeReadsBareDirectory(t *testing.T) {
	var trees []Tree
	if err := json.Unmarshal([]byte(`["/data/tasks/t1",{"dir":"/srv/repos/app","owner":{"UID":1000,"GID":1001}}]`), &trees); err != nil {
		t.Fatal(err)
	}
	want := []Tree{{Dir: "/data/tasks/t1", Owner: Identity{os.Geteuid(), os.Getegid()}}, {Dir: "/srv/repos/app", Owner: Identity{1000, 1001}}}
	if !slices.Equal(trees, want) {
		t.Errorf("got %+v, want %+v", trees, want)
	}
}

func owner(t *testing.T, p string) uint32 {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Uid
}
