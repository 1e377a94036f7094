//go:build linux

package local

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/ids"
	"github.com/corral-dev/corral/internal/lockfile"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/quota"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
	"github.com/corral-dev/corral/internal/sandbox/warmpool"
	"github.com/corral-dev/corral/internal/sandbox/warmstart"
)

// Warm sandboxes (sandbox.Warmer).
//
// A warm sandbox is a sandbox of a shape's Template started ahead of need:
// bwrap has set it up and its main process (the Template's Command, the
// worker waiting in `corral worker warm`) waits on warmstart.FD. Each of
// the Template's per-task mounts is bound from an empty slot directory,
// StateDir/_warm/<warm id>/<mount index>, given to the sandbox identity.
// The sandbox holds nothing of any task.
//
// A task whose spec fits the shape claims one (Create): its directories,
// prepared by the server, become the slots (their entries are moved into
// the slot, which then replaces the task's directory by rename, so the
// sandbox, which bound the slot's inode, sees them where the task's
// mounts say), the sandbox's state directory is renamed to the task's id,
// and the task's argv, environment and working directory go down the pipe.
// From then on it is the task's sandbox, destroyed after it like any
// other; the pool starts another. A warm sandbox is taken out of its pool
// before it is handed over, so no two tasks ever get the same one.
//
// A warm sandbox is never reattached: its main process exits when the
// pipe closes empty, which it does when the server that made it dies, and
// New destroys what is left of warm sandboxes in the state dir (putting a
// task's entries back into its directories if the server died while
// moving them).
//
// A claimed one is the task's from the rename of its state directory on,
// and is found again after a restart like any task's sandbox. Its worker
// may not have had the start then: the server can die between the rename
// and the start's write. So the worker writes ackFile (through
// warmstart.AckFD, closed before anything of the task runs) as soon as it
// has a start; a claimed sandbox that ended without it ran nothing of its
// task, and says so (sandbox.ExitStatus.NotStarted): its task starts
// again, and never takes the worker's own exit for its result.

// warmPrefix begins every warm sandbox's id; no task's sandbox has it.
// After it comes the tag of the runtime that started it, and a hyphen:
// several servers (replicas) on one host share the state dir, and each
// destroys at its start only the warm sandboxes of runtimes gone, whose
// tag's lock (warmLock) no process holds.
const warmPrefix = "warm-"

// newWarmTag returns a runtime's tag for its warm sandboxes' ids: ten
// lowercase letters and digits.
func newWarmTag() string { return strings.ToLower(rand.Text()[:10]) }

// warmLock is the lock file a runtime holds while its warm sandboxes with
// tag are its own.
func warmLock(stateDir, tag string) string { return filepath.Join(warmDir(stateDir), tag+".lock") }

// warmTagOf is the tag in a warm sandbox's id, "" for one made before tags.
func warmTagOf(id string) string {
	tag, _, ok := strings.Cut(strings.TrimPrefix(id, warmPrefix), "-")
	if !ok {
		return ""
	}
	return tag
}

// labelWarm marks a warm sandbox not yet claimed.
const labelWarm = "corral.warm"

// ackFile, in a warm sandbox's state dir, is where its worker acknowledges
// its start (warmstart.AckFD).
const ackFile = "started"

// acked reports whether the worker of the sandbox in dir acknowledged a
// start.
func acked(dir string) bool {
	fi, err := os.Stat(filepath.Join(dir, ackFile))
	return err == nil && fi.Size() > 0
}

// warmDir holds the slots of the warm sandboxes, in the state dir: a name
// no sandbox id can take.
func warmDir(stateDir string) string { return filepath.Join(stateDir, "_warm") }

// warmBox is a warm sandbox in a pool.
type warmBox struct {
	id    string
	pool  *warmpool.Pool[*warmBox] // set when it is taken
	slots []string                 // the host dir bound for each per-task mount of the template, by mount index; "" for the others
	start *os.File                 // the pipe's write end
}

// slotMap is b.slots by mount index, without the shared mounts.
func (b *warmBox) slotMap() map[int]string {
	m := map[int]string{}
	for i, s := range b.slots {
		if s != "" {
			m[i] = s
		}
	}
	return m
}

// claim is what a claim writes before it moves a task's entries, so that
// New can put them back if the server dies in between.
type claim struct {
	Task string `json:"task"`
	// Moves are the task directories, by mount index as the slots.
	Moves map[int]string `json:"moves"`
}

// KeepWarm implements sandbox.Warmer: one pool per shape, each filled to
// p.Size and refilled after every claim. A pool that has had no claim for
// p.Idle destroys its sandboxes and fills again at the next task of its
// shape, which starts cold. When ctx ends the pools destroy the sandboxes
// they hold, and KeepWarm returns.
func (r *Runtime) KeepWarm(ctx context.Context, p sandbox.WarmPolicy) error {
	if p.Size <= 0 || len(p.Shapes) == 0 {
		return nil
	}
	if caps, _ := r.Capabilities(ctx); !caps.Available {
		return fmt.Errorf("keep sandboxes warm: %s", caps.Reason)
	}
	if err := os.MkdirAll(warmDir(r.opts.StateDir), 0o711); err != nil {
		return fmt.Errorf("keep sandboxes warm: %w", err)
	}
	for _, sh := range p.Shapes {
		for _, m := range sh.Template.Mounts {
			if !m.PerTask() {
				continue
			}
			if m.HostDir {
				return fmt.Errorf("warm shape %s: the per-task mount %s must be in the data root", sh.Name, m.Target)
			}
			// A claim renames the slot over the task's directory.
			parent := filepath.Dir(filepath.Join(r.opts.DataRoot, filepath.FromSlash(m.Source)))
			if !sameFS(parent, warmDir(r.opts.StateDir)) {
				return fmt.Errorf("warm shape %s: %s and the state dir %s are not on one file system, and a claim renames from one to the other", sh.Name, parent, r.opts.StateDir)
			}
		}
	}
	return r.warm.Keep(ctx, p)
}

// WarmStats implements sandbox.Warmer.
func (r *Runtime) WarmStats() []sandbox.WarmStats { return r.warm.Stats() }

// claimWarm takes a warm sandbox for spec out of its pool, or returns nil:
// for a spec no pool's shape fits, or when the pool has none ready (a
// miss, which has the pool fill).
func (r *Runtime) claimWarm(spec sandbox.Spec) *warmBox {
	pl, b, ok := r.warm.Take(spec)
	if !ok {
		return nil
	}
	b.pool = pl
	return b
}

// releaseWarm gives an unused box back to its pool.
func (r *Runtime) releaseWarm(b *warmBox) {
	if b != nil {
		b.pool.Release(b)
	}
}

// warmOps starts and destroys the runtime's warm sandboxes for its pools.
type warmOps struct{ r *Runtime }

// StartWarm starts a sandbox of shape with empty slots for its per-task
// mounts.
func (o warmOps) StartWarm(ctx context.Context, shape sandbox.WarmShape) (*warmBox, error) {
	r := o.r
	id := warmPrefix + r.warmTag + "-" + ids.New()
	b := &warmBox{id: id, slots: make([]string, len(shape.Template.Mounts))}
	spec := shape.Template
	spec.ID = id
	spec.Labels = map[string]string{sandbox.LabelManaged: "true", labelWarm: "true"}
	spec.Mounts = slices.Clone(spec.Mounts)
	root := filepath.Join(warmDir(r.opts.StateDir), id)
	// The sandbox identity binds the slots by path: it may pass through.
	if err := os.MkdirAll(root, 0o711); err != nil {
		return nil, fmt.Errorf("create warm slots: %w", err)
	}
	if err := os.Chmod(filepath.Dir(root), 0o711); err != nil {
		return nil, fmt.Errorf("open warm slots to the sandbox identity: %w", err)
	}
	for i, m := range spec.Mounts {
		if !m.PerTask() {
			continue
		}
		slot := filepath.Join(root, strconv.Itoa(i))
		if err := os.Mkdir(slot, 0o755); err != nil {
			os.RemoveAll(root)
			return nil, fmt.Errorf("create warm slot: %w", err)
		}
		b.slots[i] = slot
		spec.Mounts[i].Source, spec.Mounts[i].HostDir = slot, true
	}
	rd, wr, err := os.Pipe()
	if err != nil {
		os.RemoveAll(root)
		return nil, fmt.Errorf("create warm start pipe: %w", err)
	}
	_, err = r.create(ctx, spec, rd)
	rd.Close()
	if err != nil {
		wr.Close()
		os.RemoveAll(root)
		return nil, err
	}
	b.start = wr
	return b, nil
}

// DestroyWarm destroys an unclaimed warm sandbox and its slots.
func (o warmOps) DestroyWarm(ctx context.Context, b *warmBox) error {
	r := o.r
	b.start.Close() // its main process ends, and so the sandbox
	if err := r.Destroy(ctx, b.id); err != nil {
		return fmt.Errorf("destroy warm sandbox %s: %w", b.id, err)
	}
	os.RemoveAll(filepath.Join(warmDir(r.opts.StateDir), b.id))
	return nil
}

// adopt hands spec's task (mounts resolved, its id locked) to the warm
// sandbox b. On error the sandbox is destroyed; the task's directories are
// where they were, or are the slots with every entry moved in.
func (r *Runtime) adopt(ctx context.Context, spec sandbox.Spec, b *warmBox) (_ *sandbox.Handle, err error) {
	r.crash(sandbox.CrashClaimed)
	e, ok := r.Dir.Cached(b.id)
	if !ok || !e.Running() {
		b.pool.Destroy(ctx, b)
		return nil, errors.New("its sandbox has ended")
	}
	if r.cg != nil {
		// It started in the background; the task runs in the fore.
		if err := r.cg.Background(e.St.Cgroups, false); err != nil {
			b.pool.Destroy(ctx, b)
			return nil, fmt.Errorf("bring it to the fore: %w", err)
		}
	}
	root := filepath.Join(warmDir(r.opts.StateDir), b.id)
	c := claim{Task: spec.ID, Moves: map[int]string{}}
	for i, slot := range b.slots {
		if slot != "" {
			c.Moves[i] = spec.Mounts[i].Source
		}
	}
	cb, _ := json.Marshal(c)
	if err := os.WriteFile(filepath.Join(root, "claim"), cb, 0o600); err != nil {
		b.pool.Destroy(ctx, b)
		return nil, fmt.Errorf("record the claim: %w", err)
	}
	for i, dst := range c.Moves {
		if err := moveInto(dst, b.slots[i]); err != nil {
			restore(c, b.slotMap())
			b.pool.Destroy(ctx, b)
			return nil, err
		}
	}
	r.crash(sandbox.CrashMoved)
	// The task's directories are the slots now, its entries in them. The
	// sandbox is the task's from here; on error it is destroyed as such.
	st := e.St
	st.ID = spec.ID
	st.Labels = maps.Clone(spec.Labels)
	st.Warm = b.id
	// The slots' own trees are the task's directories now: Give takes
	// them over.
	st.Owned, err = hostuser.Give(hostuser.WritableDirs(spec.Mounts), st.Identity)
	if err == nil {
		err = r.Dir.Write(b.id, st)
	}
	if err == nil {
		err = r.opts.Identities.Rename(b.id, spec.ID)
	}
	dir := r.Dir.Path(spec.ID)
	if err == nil {
		os.RemoveAll(dir) // a Create that crashed before it started anything
		// The claim's record goes first: once the state dir has the
		// task's name, nothing named after the warm sandbox is left for
		// the next server to destroy (its cgroups are the task's now).
		if err = os.RemoveAll(root); err == nil {
			err = os.Rename(r.Dir.Path(b.id), dir)
		}
	}
	if err != nil {
		hostuser.Reclaim(st.Owned)
		b.pool.Destroy(ctx, b)
		return nil, fmt.Errorf("hand the warm sandbox over: %w", err)
	}
	r.Dir.Forget(b.id)
	e.Dir, e.St = dir, st
	r.Dir.Set(spec.ID, e)
	r.crash(sandbox.CrashHandedOver)
	// The worker reads the start once the pipe closes; close it whatever
	// the write did, so that it never waits for more. A start written
	// whole is the worker's, whatever Close says.
	err = warmstart.Send(b.start, warmstart.Start{Argv: spec.Command, Env: sandbox.DefaultEnv(spec.Env), Dir: spec.Dir})
	b.start.Close()
	if err != nil {
		r.Stop(ctx, spec.ID, 0)
		r.Dir.Remove(st.Launch, dir, false)
		r.Dir.Forget(spec.ID)
		return nil, fmt.Errorf("start the task in the warm sandbox: %w", err)
	}
	r.crash(sandbox.CrashSent)
	r.log.Info("sandbox started", logkey.SandboxID, spec.ID, "pid", st.ChildPID, "warm_id", b.id)
	return r.Handle(st), nil
}

// moveInto moves every entry of the directory src into the empty
// directory slot, gives slot src's mode and project quota, and renames
// slot over src, so that src's path names slot's inode with src's entries
// in it, held to the same quota.
func moveInto(src, slot string) error {
	fi, err := os.Lstat(src)
	if err != nil {
		return fmt.Errorf("the task's directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("the task's %s is not a directory", src)
	}
	if err := copyProject(slot, src); err != nil {
		return fmt.Errorf("give the warm sandbox's directory the task's project quota: %w", err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, ent := range ents {
		if err := os.Rename(filepath.Join(src, ent.Name()), filepath.Join(slot, ent.Name())); err != nil {
			return fmt.Errorf("move the task's entry into the warm sandbox: %w", err)
		}
	}
	if err := os.Chmod(slot, fi.Mode().Perm()); err != nil {
		return err
	}
	// rename(2) itself: os.Rename refuses to replace a directory.
	if err := unix.Rename(slot, src); err != nil {
		return fmt.Errorf("place the warm sandbox's directory %s as the task's %s: %w", slot, src, err)
	}
	return nil
}

// copyProject is quota.CopyProject on two directories' paths. It comes
// first: a directory whose project is inherited refuses entries of
// another project (EXDEV).
func copyProject(dst, src string) error {
	d, err := os.Open(dst)
	if err != nil {
		return err
	}
	defer d.Close()
	s, err := os.Open(src)
	if err != nil {
		return err
	}
	defer s.Close()
	return quota.CopyProject(d, s)
}

// restore moves a claim's entries back from the slots that are still
// slots into the task's directories, where a claim stopped half way.
func restore(c claim, slots map[int]string) error {
	var errs []error
	for i, dst := range c.Moves {
		if slots[i] == "" {
			continue
		}
		ents, err := os.ReadDir(slots[i])
		if errors.Is(err, fs.ErrNotExist) {
			continue // renamed: the task's directory already
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, ent := range ents {
			if err := os.Rename(filepath.Join(slots[i], ent.Name()), filepath.Join(dst, ent.Name())); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// destroyLeftoverWarm destroys the warm sandboxes an earlier process left
// in the state dir, after putting back a half-claimed task's entries, and
// their slots. A slot directory whose entries could not be put back stays.
// Those of a runtime still running (another server on this host, sharing
// the state dir) are its own, and stay.
func (r *Runtime) destroyLeftoverWarm(ctx context.Context) {
	// Each other runtime's tag, and whether it is gone: no process holds
	// its lock.
	gone := map[string]bool{}
	locks, _ := filepath.Glob(warmLock(r.opts.StateDir, "*"))
	for _, l := range locks {
		tag := strings.TrimSuffix(filepath.Base(l), ".lock")
		if tag == r.warmTag {
			continue
		}
		f, err := lockfile.TryAcquire(l)
		gone[tag] = err == nil && f != nil
		f.Release()
	}
	defer func() {
		for tag, free := range gone {
			if free {
				os.Remove(warmLock(r.opts.StateDir, tag))
			}
		}
	}()
	ids := map[string]bool{}
	for _, dir := range []string{r.opts.StateDir, warmDir(r.opts.StateDir)} {
		ents, _ := os.ReadDir(dir)
		for _, ent := range ents {
			id := ent.Name()
			if !strings.HasPrefix(id, warmPrefix) || sandbox.ValidateID(id) != nil {
				continue
			}
			// A live runtime's are its own. One without a tag is from
			// before tags; one whose tag has no lock file left a runtime
			// gone.
			tag := warmTagOf(id)
			if isGone, locked := gone[tag]; tag != r.warmTag && (!locked || isGone) {
				ids[id] = true
			}
		}
	}
	for id := range ids {
		if err := r.Destroy(ctx, id); err != nil {
			r.log.Warn("cannot destroy a warm sandbox left by an earlier server", logkey.SandboxID, id, logkey.Error, err)
			continue
		}
		// A claim that stopped after its state took the task's id kept
		// the lease under the warm sandbox's, which Destroy released.
		if err := r.opts.Identities.Release(id); err != nil {
			r.log.Warn("cannot release the identity of a warm sandbox left by an earlier server", logkey.SandboxID, id, logkey.Error, err)
		}
		root := filepath.Join(warmDir(r.opts.StateDir), id)
		if b, err := os.ReadFile(filepath.Join(root, "claim")); err == nil {
			var c claim
			if err := json.Unmarshal(b, &c); err == nil {
				slots := map[int]string{}
				for i := range c.Moves {
					slots[i] = filepath.Join(root, strconv.Itoa(i))
				}
				err = restore(c, slots)
			}
			if err != nil {
				r.log.Warn("cannot put a task's entries back from a warm sandbox's slot", "task_id", c.Task, "slot", root, logkey.Error, err)
				continue
			}
		}
		os.RemoveAll(root)
	}
}

// sameFS reports whether a and b are on the same file system (a missing
// one is not).
func sameFS(a, b string) bool {
	var sa, sb unix.Stat_t
	return unix.Stat(a, &sa) == nil && unix.Stat(b, &sb) == nil && sa.Dev == sb.Dev
}
