// Package statedir keeps the bookkeeping the host runtimes (sandbox/local,
// sandbox/gvisor) share over their state directory: one subdirectory per
// sandbox, named by its id, holding state.json (the runtime's Handle.State);
// a lock per id; the sandboxes this instance has seen; listing by label;
// and decoding a Handle's state; and (Sandboxes) the lifecycle methods
// both runtimes share around a launcher process: Recover, Wait, Status,
// Stop, List and Destroy. What a runtime keeps besides state.json, how it
// starts its launcher, reads an exit status and signals its processes
// stay with the runtime (Ops).
package statedir

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/cgroups"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
)

// Dir is a runtime's state directory holding states S, with the entries E
// (a runtime's in-memory view of one sandbox) this instance knows. It is
// safe for concurrent use. Create it with New.
type Dir[S, E any] struct {
	root   string
	labels func(S) map[string]string
	ids    *hostuser.Identities // nil: sandboxes lease no identity here

	// locks serialise a runtime's state changes per id, striped by a hash
	// of the id so no per-id lock has to be freed.
	locks [stripes]sync.Mutex

	mu      sync.Mutex
	entries map[string]*E
}

// New returns the Dir at root; labels returns a state's labels, for List.
func New[S, E any](root string, labels func(S) map[string]string) *Dir[S, E] {
	return &Dir[S, E]{root: root, labels: labels, entries: map[string]*E{}}
}

// Path is id's subdirectory.
func (d *Dir[S, E]) Path(id string) string { return filepath.Join(d.root, id) }

// Pins is where sandbox id's host directories are pinned (hostuser.Pin):
// beside the state dirs, in a directory that is no sandbox's (List skips
// it), so that no removal of a state dir can reach a workspace through a
// pin.
func (d *Dir[S, E]) Pins(id string) string { return pinsOf(d.Path(id)) }

func pinsOf(dir string) string { return filepath.Join(filepath.Dir(dir), ".pins", filepath.Base(dir)) }

// stripes is how many locks a Dir has.
const stripes = 64

// Lock locks id's stripe and returns its unlock function. Two ids may
// share a stripe (Stripe): one who holds an id's must not lock another's.
func (d *Dir[S, E]) Lock(id string) (unlock func()) {
	l := &d.locks[Stripe(id)]
	l.Lock()
	return l.Unlock
}

// Stripe is the stripe of Dir's locks that id's lock is.
func Stripe(id string) int {
	h := fnv.New32a()
	h.Write([]byte(id))
	return int(h.Sum32() % stripes)
}

// Cached returns the entry this instance keeps for id, if any.
func (d *Dir[S, E]) Cached(id string) (*E, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.entries[id]
	return e, ok
}

// Lookup returns id's entry from memory or, after a restart, one built by
// newEntry from its state dir and remembered. It wraps errdefs.ErrNotFound
// if there is neither (an id that is not valid is never found).
func (d *Dir[S, E]) Lookup(id string, newEntry func(dir string, st S) *E) (*E, error) {
	if sandbox.ValidateID(id) != nil {
		return nil, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	if e, ok := d.Cached(id); ok {
		return e, nil
	}
	st, err := d.Read(id)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return d.Remember(id, newEntry(d.Path(id), st)), nil
}

// Remember keeps e as id's entry unless there is one already, and returns
// the one kept.
func (d *Dir[S, E]) Remember(id string, e *E) *E {
	d.mu.Lock()
	defer d.mu.Unlock()
	if old, ok := d.entries[id]; ok {
		return old
	}
	d.entries[id] = e
	return e
}

// Set keeps e as id's entry, replacing any.
func (d *Dir[S, E]) Set(id string, e *E) {
	d.mu.Lock()
	d.entries[id] = e
	d.mu.Unlock()
}

// Forget drops id's entry.
func (d *Dir[S, E]) Forget(id string) {
	d.mu.Lock()
	delete(d.entries, id)
	d.mu.Unlock()
}

// Read returns id's state from its state.json. It returns
// errdefs.ErrNotFound if there is none.
func (d *Dir[S, E]) Read(id string) (S, error) {
	var st S
	b, err := os.ReadFile(filepath.Join(d.Path(id), "state.json"))
	if errors.Is(err, os.ErrNotExist) {
		return st, errdefs.ErrNotFound
	}
	if err != nil {
		return st, fmt.Errorf("read state: %w", err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("decode state: %v: %w", err, errTorn)
	}
	return st, nil
}

// errTorn is a state.json that does not decode: one a power loss tore,
// since it is not fsynced (WriteFileAtomic), and so one whose processes
// are gone.
var errTorn = errors.New("state.json is torn")

// Write replaces id's state.json atomically.
func (d *Dir[S, E]) Write(id string, st S) error {
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	if err := WriteFileAtomic(filepath.Join(d.Path(id), "state.json"), b, 0o600); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	return nil
}

// List returns the states of the sandboxes in the directory whose labels
// include every label in selector. Subdirectories that are not named by a
// valid id or hold no readable state (being created or destroyed) are
// skipped.
func (d *Dir[S, E]) List(selector map[string]string) ([]S, error) {
	ents, err := os.ReadDir(d.root)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	var out []S
	for _, de := range ents {
		if !de.IsDir() || sandbox.ValidateID(de.Name()) != nil {
			continue
		}
		st, err := d.Read(de.Name())
		if err != nil {
			continue
		}
		if matches(d.labels(st), selector) {
			out = append(out, st)
		}
	}
	return out, nil
}

func matches(labels, selector map[string]string) bool {
	for k, v := range selector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// DecodeHandle returns the state in h, which must be a Handle of runtime
// (or name none) at version. Errors wrap errdefs.ErrInvalidArgument.
func DecodeHandle[S any](h *sandbox.Handle, runtime string, version int) (S, error) {
	var st S
	if h == nil || (h.Runtime != "" && h.Runtime != runtime) {
		return st, fmt.Errorf("not a %s handle: %w", runtime, errdefs.ErrInvalidArgument)
	}
	if h.Version != version {
		return st, fmt.Errorf("sandbox %s: unknown state version %d: %w", h.ID, h.Version, errdefs.ErrInvalidArgument)
	}
	if err := json.Unmarshal(h.State, &st); err != nil {
		return st, fmt.Errorf("sandbox %s: decode state: %v: %w", h.ID, err, errdefs.ErrInvalidArgument)
	}
	return st, nil
}

// WriteFileAtomic writes path atomically: a temporary file renamed over
// it. Readers see the old content or the new, never a part. Not fsynced:
// a state dir describes processes, and the power loss an fsync guards
// against takes them all; after one, a sandbox whose state.json is missing
// or old is found gone, and its task ends as lost, as it would anyway. A
// crash of the server alone loses nothing: the page cache keeps the file.
// (An fsync cost a sandbox's start, cold or claimed, 0.3 to 1.5 ms here.)
func WriteFileAtomic(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Launch is the part of a sandbox's state both host runtimes keep: its id
// and labels, the launcher process on the host (with its start time,
// against pid reuse), the cgroups and read-write directories it was given,
// and when. A runtime's state embeds it.
type Launch struct {
	ID       string            `json:"id"`
	Labels   map[string]string `json:"labels,omitempty"`
	PID      int               `json:"pid"`       // the launcher on the host
	PIDStart uint64            `json:"pid_start"` // its start time, against pid reuse
	Cgroups  []string          `json:"cgroups,omitempty"`
	// Owned are the read-write directories given to the sandbox identity,
	// taken back by Remove.
	Owned []hostuser.Tree `json:"owned,omitempty"`
	// Identity is the sandbox's host identity (zero in state of before
	// each sandbox had its own).
	Identity  hostuser.Identity `json:"identity,omitzero"`
	CreatedAt time.Time         `json:"created_at"`
	// Warm is the id a task's sandbox had while it was warm, "" for one
	// started cold (package warmpool): its worker had the task's start
	// only if it acknowledged it (warmpool.Acked).
	Warm string `json:"warm,omitempty"`
}

func (l Launch) launch() Launch { return l }

// LaunchOf is st's Launch.
func LaunchOf[S Launched](st S) Launch { return st.launch() }

// WithLaunch is st with its Launch replaced by l.
func WithLaunch[S Launched](st S, l Launch) S {
	// A Launched embeds a Launch (launch is unexported), whose setLaunch
	// *S has.
	any(&st).(interface{ setLaunch(Launch) }).setLaunch(l)
	return st
}

func (l *Launch) setLaunch(n Launch) { *l = n }

// Launched is a runtime's state: one that embeds a Launch.
type Launched interface{ launch() Launch }

// Handle is st as a Handle of runtime at version.
func Handle[S Launched](runtime string, version int, st S) *sandbox.Handle {
	b, _ := json.Marshal(st) // a struct of plain fields always encodes
	l := st.launch()
	return &sandbox.Handle{ID: l.ID, Runtime: runtime, Labels: maps.Clone(l.Labels), Version: version, State: b}
}

// Handles lists the sandboxes in d whose labels include selector, as
// Handles of runtime at version.
func Handles[S Launched, E any](d *Dir[S, E], runtime string, version int, selector map[string]string) ([]sandbox.Handle, error) {
	sts, err := d.List(selector)
	if err != nil {
		return nil, err
	}
	var out []sandbox.Handle
	for _, st := range sts {
		out = append(out, *Handle(runtime, version, st))
	}
	return out, nil
}

// CheckRecover checks that h, a Handle of runtime at version, names the
// launcher the state dir knows (found): the state dir is the source of
// truth, and a handle naming another process is a conflict.
func CheckRecover[S Launched](h *sandbox.Handle, runtime string, version int, found S) error {
	st, err := DecodeHandle[S](h, runtime, version)
	if err != nil {
		return fmt.Errorf("recover sandbox: %w", err)
	}
	l, f := st.launch(), found.launch()
	if l.PID != 0 && (l.PID != f.PID || l.PIDStart != f.PIDStart) {
		return fmt.Errorf("recover sandbox %s: handle names another process than the state dir: %w", h.ID, errdefs.ErrConflict)
	}
	return nil
}

// Remove is the end of destroying a sandbox whose processes are gone: its
// cgroups, with anything still in them (or they cannot be removed); the
// directories it was given, taken back now that nothing of it can change
// them underneath; its pins; its state dir; and, unless keepLease, its
// identity's lease.
func (d *Dir[S, E]) Remove(l Launch, dir string, keepLease bool) error {
	if err := cgroups.KillAndRemove(l.Cgroups); err != nil {
		return err
	}
	if err := hostuser.Reclaim(l.Owned); err != nil {
		return err
	}
	if err := hostuser.Unpin(pinsOf(dir)); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove state dir: %w", err)
	}
	if keepLease {
		return nil
	}
	return d.release(l.ID)
}

// release ends sandbox id's lease of its identity.
func (d *Dir[S, E]) release(id string) error {
	if d.ids == nil {
		return nil
	}
	return d.ids.Release(id)
}

// RemoveLeftovers cleans what a Create that crashed before writing its
// state left of sandbox id: the cgroups named after it (under cg, nil
// when the runtime runs without cgroups), a half-made state dir and,
// unless keepLease (a restore's: its processes run as the identity they
// had), its identity's lease.
func (d *Dir[S, E]) RemoveLeftovers(cg *cgroups.Hierarchy, id string, keepLease bool) error {
	if err := hostuser.Unpin(d.Pins(id)); err != nil {
		return err
	}
	if cg != nil {
		if err := cgroups.KillAndRemove(cg.Dirs(id)); err != nil {
			return err
		}
	}
	os.RemoveAll(d.Path(id))
	if keepLease {
		return nil
	}
	return d.release(id)
}
