//go:build linux

package warmpool

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/corral-dev/corral/internal/lockfile"
	"github.com/corral-dev/corral/internal/logkey"
	"github.com/corral-dev/corral/internal/quota"
	"github.com/corral-dev/corral/internal/sandbox"
)

// What the host runtimes (local, gvisor) share of their warm sandboxes
// beyond the pools: the ids that say whose a warm sandbox is, and the
// slots a claim hands a task's directories over through.
//
// A warm sandbox binds an empty slot directory, Dir/<warm id>/<mount
// index>, for each per-task mount of its shape's template. A claim moves
// the task directory's entries into the slot and renames the slot over
// the task's directory, so that the sandbox, which bound the slot's inode,
// sees them where the task's mounts say; it records what it moves first
// (ClaimFile), so that a server that dies half way can put them back.

// Prefix begins every warm sandbox's id; no task's sandbox has it. After
// it comes the tag of the runtime that started it, and a hyphen: several
// servers (replicas) on one host share a state dir, and each destroys at
// its start only the warm sandboxes of runtimes gone, whose tag's lock
// (LockPath) no process holds.
const Prefix = "warm-"

// ClaimFile, in a warm sandbox's slot directory, is the claim's record.
const ClaimFile = "claim"

// Claim is what a claim writes before it moves a task's entries.
type Claim struct {
	Task string `json:"task"`
	// Moves are the task directories, by mount index as the slots.
	Moves map[int]string `json:"moves"`
}

// LockPath is the lock file a runtime holds in dir while its warm
// sandboxes with tag are its own.
func LockPath(dir, tag string) string { return filepath.Join(dir, tag+".lock") }

// TagOf is the tag in a warm sandbox's id, "" for one made before tags.
func TagOf(id string) string {
	tag, _, ok := strings.Cut(strings.TrimPrefix(id, Prefix), "-")
	if !ok {
		return ""
	}
	return tag
}

// Own picks a new tag, ten lowercase letters and digits, and takes its
// lock in dir.
func Own(dir string) (tag string, lock *lockfile.File, err error) {
	for lock == nil {
		tag = strings.ToLower(rand.Text()[:10])
		if lock, err = lockfile.TryAcquire(LockPath(dir, tag)); err != nil {
			return "", nil, err
		}
	}
	return tag, lock, nil
}

// Leftovers are the ids of the warm sandboxes in dirs left by a runtime
// gone (its tag's lock, in lockDir, held by no process, or no lock at
// all), not those of own's or of another runtime still running. done
// removes the locks of the runtimes gone, once their sandboxes are.
func Leftovers(lockDir, own string, dirs ...string) (ids []string, done func()) {
	gone := map[string]bool{}
	locks, _ := filepath.Glob(LockPath(lockDir, "*"))
	for _, l := range locks {
		tag := strings.TrimSuffix(filepath.Base(l), ".lock")
		if tag == own {
			continue
		}
		f, err := lockfile.TryAcquire(l)
		gone[tag] = err == nil && f != nil
		f.Release()
	}
	seen := map[string]bool{}
	for _, dir := range dirs {
		ents, _ := os.ReadDir(dir)
		for _, ent := range ents {
			id := ent.Name()
			if !strings.HasPrefix(id, Prefix) || sandbox.ValidateID(id) != nil || seen[id] {
				continue
			}
			// A live runtime's are its own. One without a tag is from
			// before tags; one whose tag has no lock file left a runtime
			// gone.
			tag := TagOf(id)
			if isGone, locked := gone[tag]; tag != own && (!locked || isGone) {
				seen[id] = true
				ids = append(ids, id)
			}
		}
	}
	return ids, func() {
		for tag, free := range gone {
			if free {
				os.Remove(LockPath(lockDir, tag))
			}
		}
	}
}

// Slots creates the empty slot directory of each per-task mount of
// mounts in root, and returns them by mount index ("" for the others).
func Slots(root string, mounts []sandbox.Mount) ([]string, error) {
	// The sandbox identity binds the slots by path: it may pass through.
	if err := os.MkdirAll(root, 0o711); err != nil {
		return nil, fmt.Errorf("create warm slots: %w", err)
	}
	if err := os.Chmod(filepath.Dir(root), 0o711); err != nil {
		return nil, fmt.Errorf("open warm slots to the sandbox identity: %w", err)
	}
	slots := make([]string, len(mounts))
	for i, m := range mounts {
		if !m.PerTask() {
			continue
		}
		slots[i] = filepath.Join(root, strconv.Itoa(i))
		if err := os.Mkdir(slots[i], 0o755); err != nil {
			os.RemoveAll(root)
			return nil, fmt.Errorf("create warm slot: %w", err)
		}
	}
	return slots, nil
}

// CheckShape checks that sh's per-task mounts can be handed over through
// slots in slotDir: they are in dataRoot, on slotDir's file system.
func CheckShape(sh sandbox.WarmShape, dataRoot, slotDir string) error {
	for _, m := range sh.Template.Mounts {
		if !m.PerTask() {
			continue
		}
		if m.HostDir {
			return fmt.Errorf("warm shape %s: the per-task mount %s must be in the data root", sh.Name, m.Target)
		}
		// A claim renames the slot over the task's directory.
		parent := filepath.Dir(filepath.Join(dataRoot, filepath.FromSlash(m.Source)))
		if !SameFS(parent, slotDir) {
			return fmt.Errorf("warm shape %s: %s and the state dir %s are not on one file system, and a claim renames from one to the other", sh.Name, parent, slotDir)
		}
	}
	return nil
}

// HandOver moves the entries of each task directory of spec (its mounts
// resolved) into the slot of the same mount index, after recording the
// claim in root. On error the entries moved are back where they were, or
// the slot holds all of them and is the task's directory.
func HandOver(root string, slots []string, spec sandbox.Spec) error {
	c := Claim{Task: spec.ID, Moves: map[int]string{}}
	slotMap := map[int]string{}
	for i, slot := range slots {
		if slot != "" {
			c.Moves[i] = spec.Mounts[i].Source
			slotMap[i] = slot
		}
	}
	cb, _ := json.Marshal(c)
	if err := os.WriteFile(filepath.Join(root, ClaimFile), cb, 0o600); err != nil {
		return fmt.Errorf("record the claim: %w", err)
	}
	for i, dst := range c.Moves {
		if err := moveInto(dst, slots[i]); err != nil {
			Restore(c, slotMap)
			return err
		}
	}
	return nil
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

// Restore moves a claim's entries back from the slots that are still
// slots into the task's directories, where a claim stopped half way.
func Restore(c Claim, slots map[int]string) error {
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

// DestroyLeftovers destroys the warm sandboxes a runtime gone left in
// stateDir (Leftovers; their slots and locks in slotDir), after putting
// back a half-claimed task's entries, and their slots; those of own's or
// of another runtime still running (another server on this host, sharing
// the state dir) stay. destroy destroys one by its id; release releases
// its identity's lease, which a claim that stopped after its state took
// the task's id kept under the warm id. A slot directory whose entries
// could not be put back stays.
func DestroyLeftovers(ctx context.Context, stateDir, slotDir, own string, destroy func(context.Context, string) error, release func(string) error, log *slog.Logger) {
	ids, done := Leftovers(slotDir, own, stateDir, slotDir)
	defer done()
	for _, id := range ids {
		if err := destroy(ctx, id); err != nil {
			log.Warn("cannot destroy a warm sandbox left by an earlier server", logkey.SandboxID, id, logkey.Error, err)
			continue
		}
		if err := release(id); err != nil {
			log.Warn("cannot release the identity of a warm sandbox left by an earlier server", logkey.SandboxID, id, logkey.Error, err)
		}
		root := filepath.Join(slotDir, id)
		if task, err := RestoreLeftover(root); err != nil {
			log.Warn("cannot put a task's entries back from a warm sandbox's slot", "task_id", task, "slot", root, logkey.Error, err)
			continue
		}
		os.RemoveAll(root)
	}
}

// RestoreLeftover puts back the entries of a claim recorded in root, the
// slot directory of a warm sandbox destroyed after a restart, and returns
// the claim's task ("" for none). root can go once it returns nil.
func RestoreLeftover(root string) (task string, err error) {
	b, err := os.ReadFile(filepath.Join(root, ClaimFile))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	var c Claim
	if err := json.Unmarshal(b, &c); err != nil {
		return "", err
	}
	slots := map[int]string{}
	for i := range c.Moves {
		slots[i] = filepath.Join(root, strconv.Itoa(i))
	}
	return c.Task, Restore(c, slots)
}

// SameFS reports whether a and b are on the same file system (a missing
// one is not).
func SameFS(a, b string) bool {
	var sa, sb unix.Stat_t
	return unix.Stat(a, &sa) == nil && unix.Stat(b, &sb) == nil && sa.Dev == sb.Dev
}
