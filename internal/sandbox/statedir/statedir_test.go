package statedir_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/statedir"
)

type state struct {
	ID     string            `json:"id"`
	Labels map[string]string `json:"labels,omitempty"`
	PID    int               `json:"pid"`
}

type entry struct{ n int }

func MustNew(tb testing.TB) (*statedir.Dir[state, entry], string) {
	tb.Helper()
	root := tb.TempDir()
	return statedir.New[state, entry](root, func(st state) map[string]string { return st.Labels }), root
}

func mustWrite(tb testing.TB, d *statedir.Dir[state, entry], st state) {
	tb.Helper()
	if err := os.MkdirAll(d.Path(st.ID), 0o700); err != nil {
		tb.Fatal(err)
	}
	if err := d.Write(st.ID, st); err != nil {
		tb.Fatal(err)
	}
}

func TestReadWrite(t *testing.T) {
	d, root := MustNew(t)
	if got := d.Path("a"); got != filepath.Join(root, "a") {
		t.Errorf("Path = %s", got)
	}
	if _, err := d.Read("a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Read of a missing state: %v, want ErrNotFound", err)
	}
	want := state{ID: "a", Labels: map[string]string{"k": "v"}, PID: 42}
	mustWrite(t, d, want)
	got, err := d.Read("a")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Read (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(filepath.Join(root, "a", "state.json.tmp")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary file left: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(root, "a", "state.json")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("state.json: %v, %v; want mode 0600", fi, err)
	}
	os.WriteFile(filepath.Join(root, "a", "state.json"), []byte("{"), 0o600)
	if _, err := d.Read("a"); err == nil || errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Read of a corrupt state: %v, want a decode error", err)
	}
}

func TestList(t *testing.T) {
	d, root := MustNew(t)
	mustWrite(t, d, state{ID: "a", Labels: map[string]string{"task": "1", "m": "y"}})
	mustWrite(t, d, state{ID: "b", Labels: map[string]string{"task": "2", "m": "y"}})
	mustWrite(t, d, state{ID: "c"})
	// Neither a directory without state, a file, nor a directory whose
	// name is no id shows.
	os.Mkdir(filepath.Join(root, "creating"), 0o700)
	os.WriteFile(filepath.Join(root, "file"), nil, 0o600)
	os.Mkdir(filepath.Join(root, ".probe"), 0o700)
	os.WriteFile(filepath.Join(root, ".probe", "state.json"), []byte(`{"id":".probe"}`), 0o600)

	ids := func(sel map[string]string) []string {
		t.Helper()
		sts, err := d.List(sel)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, st := range sts {
			out = append(out, st.ID)
		}
		slices.Sort(out)
		return out
	}
	for _, tc := range []struct {
		sel  map[string]string
		want []string
	}{
		{nil, []string{"a", "b", "c"}},
		{map[string]string{"m": "y"}, []string{"a", "b"}},
		{map[string]string{"m": "y", "task": "2"}, []string{"b"}},
		{map[string]string{"m": "n"}, nil},
	} {
		if diff := cmp.Diff(tc.want, ids(tc.sel)); diff != "" {
			t.Errorf("List(%v) (-want +got):\n%s", tc.sel, diff)
		}
	}
	if _, err := statedir.New[state, entry](filepath.Join(root, "missing"), nil).List(nil); err == nil {
		t.Error("List of a missing directory succeeded")
	}
}

func TestEntries(t *testing.T) {
	d, _ := MustNew(t)
	if _, ok := d.Cached("a"); ok {
		t.Fatal("empty Dir has an entry")
	}
	first := &entry{n: 1}
	if got := d.Remember("a", first); got != first {
		t.Errorf("Remember returned %v, want the new entry", got)
	}
	if got := d.Remember("a", &entry{n: 2}); got != first {
		t.Errorf("second Remember returned %v, want the first entry", got)
	}
	second := &entry{n: 2}
	d.Set("a", second)
	if got, ok := d.Cached("a"); !ok || got != second {
		t.Errorf("Cached after Set = %v, %v", got, ok)
	}
	d.Forget("a")
	if _, ok := d.Cached("a"); ok {
		t.Error("entry survives Forget")
	}
}

func TestLockSerialisesOneID(t *testing.T) {
	d, _ := MustNew(t)
	unlock := d.Lock("a")
	locked := make(chan struct{})
	go func() {
		u := d.Lock("a")
		close(locked)
		u()
	}()
	select {
	case <-locked:
		t.Fatal("second Lock of one id did not wait")
	case <-time.After(50 * time.Millisecond):
	}
	unlock()
	select {
	case <-locked:
	case <-time.After(10 * time.Second):
		t.Fatal("Lock not released")
	}
	var wg sync.WaitGroup
	n := 0
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer d.Lock("b")()
			n++ // the race detector sees an unserialised increment
		}()
	}
	wg.Wait()
	if n != 20 {
		t.Errorf("n = %d, want 20", n)
	}
}

func TestDecodeHandle(t *testing.T) {
	st := state{ID: "a", PID: 7}
	b, _ := json.Marshal(st)
	h := &sandbox.Handle{ID: "a", Runtime: "local", Version: 1, State: b}
	got, err := statedir.DecodeHandle[state](h, "local", 1)
	if err != nil || got.PID != 7 {
		t.Errorf("DecodeHandle = %+v, %v", got, err)
	}
	noName := *h
	noName.Runtime = ""
	if _, err := statedir.DecodeHandle[state](&noName, "local", 1); err != nil {
		t.Errorf("handle without a runtime name: %v", err)
	}
	for name, h := range map[string]*sandbox.Handle{
		"nil":           nil,
		"other runtime": {ID: "a", Runtime: "gvisor", Version: 1, State: b},
		"version":       {ID: "a", Runtime: "local", Version: 2, State: b},
		"bad state":     {ID: "a", Runtime: "local", Version: 1, State: []byte("{")},
	} {
		if _, err := statedir.DecodeHandle[state](h, "local", 1); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
}

// launched is a runtime's state as the host runtimes keep theirs.
type launched struct {
	statedir.Launch
	Extra int `json:"extra"`
}

// A Handle carries the whole state; Handles lists by label; CheckRecover
// refuses a handle that names another launcher; Remove and
// RemoveLeftovers clear a state dir.
func TestLaunchHelpers(t *testing.T) {
	root := t.TempDir()
	d := statedir.New[launched, struct{}](root, func(st launched) map[string]string { return st.Labels })
	st := launched{Launch: statedir.Launch{ID: "a", Labels: map[string]string{"task": "1"}, PID: 7, PIDStart: 99}, Extra: 3}
	if err := os.MkdirAll(d.Path("a"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := d.Write("a", st); err != nil {
		t.Fatal(err)
	}
	h := statedir.Handle("rt", 1, st)
	if h.ID != "a" || h.Runtime != "rt" || h.Labels["task"] != "1" || !strings.Contains(string(h.State), `"extra":3`) || !strings.Contains(string(h.State), `"pid":7`) {
		t.Errorf("handle %+v %s", h, h.State)
	}
	hs, err := statedir.Handles(d, "rt", 1, map[string]string{"task": "1"})
	if err != nil || len(hs) != 1 || hs[0].ID != "a" {
		t.Errorf("Handles: %+v, %v", hs, err)
	}
	if err := statedir.CheckRecover(h, "rt", 1, st); err != nil {
		t.Errorf("CheckRecover of its own handle: %v", err)
	}
	other := st
	other.PIDStart = 100
	if err := statedir.CheckRecover(statedir.Handle("rt", 1, other), "rt", 1, st); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("CheckRecover of another launcher: %v, want a conflict", err)
	}
	if err := d.Remove(st.Launch, d.Path("a"), false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.Path("a")); !os.IsNotExist(err) {
		t.Errorf("state dir left: %v", err)
	}
	os.MkdirAll(d.Path("b"), 0o700)
	if err := d.RemoveLeftovers(nil, "b", false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.Path("b")); !os.IsNotExist(err) {
		t.Errorf("half-made state dir left: %v", err)
	}
}

// LaunchOf reads a state's Launch, WithLaunch replaces it and nothing
// else of the state.
func TestWithLaunch(t *testing.T) {
	st := launched{Launch: statedir.Launch{ID: "warm-x", PID: 7}, Extra: 3}
	l := statedir.LaunchOf(st)
	l.ID, l.Warm = "task", "warm-x"
	got := statedir.WithLaunch(st, l)
	if got.ID != "task" || got.Warm != "warm-x" || got.PID != 7 || got.Extra != 3 {
		t.Errorf("WithLaunch: %+v", got)
	}
	if st.ID != "warm-x" || st.Warm != "" {
		t.Errorf("WithLaunch changed its argument: %+v", st)
	}
}
