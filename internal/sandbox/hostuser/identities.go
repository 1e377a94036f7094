package hostuser

import (
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Span is how many host uids above Reserved the sandboxes of a root server
// take, one each: Reserved+1 to Reserved+Span. Their gid is Reserved, the
// group the data root lets pass, for all of them.
const Span = 65535

// InRange reports whether uid is one a sandbox runs as under a root server
// with the default identities: Reserved itself (what sandboxes ran as
// before each had its own) or one of Span above it.
func InRange(uid int) bool { return uid >= Reserved && uid <= Reserved+Span }

// Identities leases every sandbox a host identity of its own, so that what
// escapes one sandbox's namespaces is still another host user than every
// other sandbox, and reaches none of their directories (Give closes the top
// of each tree it gives to its owner alone). A lease is a file in a
// directory of the server's, named by the uid and holding the sandbox's
// id, made with O_EXCL: two sandboxes never hold one uid, whichever runtime
// starts them, and a lease outlives a restart of the server as its sandbox
// does. The one exception is Share: a sandbox restored from another's
// memory, whose processes keep the uid they had, holds that one too (a
// line each in the lease), and the uid is free once the last lets go.
// Under a server that is not root, or with an identity an operator
// configured, every sandbox gets that one identity (Fixed).
//
// It is safe for concurrent use.
type Identities struct {
	fixed Identity // zero: one of the range for each sandbox
	dir   string
	salt  uint32 // where this server's sandboxes start looking in the range

	mu sync.Mutex
	// seen is the uid each sandbox this instance leased, renamed, shared
	// or found held at the time: the one lease find reads first. It is a
	// hint, never the answer: another instance over the same leases (a
	// restarted server beside a stopping one) may have moved it.
	seen map[string]int
}

// NewIdentities returns identities for sandboxes: each its own from the
// range above Reserved, with leases in dir, when base is Default() under a
// root server; else base for every one.
func NewIdentities(base Identity, dir string) *Identities {
	if !base.Switch() || base != Default() {
		return &Identities{fixed: base}
	}
	h := fnv.New32a()
	h.Write([]byte(dir))
	return &Identities{dir: dir, salt: h.Sum32(), seen: map[string]int{}}
}

// Fixed is the one identity of every sandbox, or zero when each has its
// own.
func (p *Identities) Fixed() Identity { return p.fixed }

// Base is what every sandbox's identity has in common, for checks of what
// they may reach: the fixed identity, or Reserved with its group.
func (p *Identities) Base() Identity {
	if p.fixed != (Identity{}) {
		return p.fixed
	}
	return Identity{UID: Reserved, GID: Reserved}
}

// Take returns sandbox id's identity, leasing it one if it has none.
func (p *Identities) Take(id string) (Identity, error) {
	if p.fixed != (Identity{}) {
		return p.fixed, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if uid, holders, err := p.find(id); err != nil || holders != nil {
		return Identity{UID: uid, GID: Reserved}, err
	}
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return Identity{}, fmt.Errorf("lease a sandbox identity: %w", err)
	}
	h := fnv.New32a()
	h.Write([]byte(id))
	start := (h.Sum32() ^ p.salt) % Span
	for i := range uint32(Span) {
		uid := Reserved + 1 + int((start+i)%Span)
		f, err := os.OpenFile(filepath.Join(p.dir, strconv.Itoa(uid)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return Identity{}, fmt.Errorf("lease a sandbox identity: %w", err)
		}
		_, err = f.WriteString(id)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(f.Name())
			return Identity{}, fmt.Errorf("lease a sandbox identity: %w", err)
		}
		p.seen[id] = uid
		return Identity{UID: uid, GID: Reserved}, nil
	}
	return Identity{}, fmt.Errorf("lease a sandbox identity: all %d are leased (%s)", Span, p.dir)
}

// Rename moves sandbox old's lease to sandbox new (a warm sandbox that a
// task claimed takes the task's name).
func (p *Identities) Rename(old, new string) error {
	if p.fixed != (Identity{}) {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	uid, holders, err := p.find(old)
	if err != nil || holders == nil {
		return err
	}
	holders[slices.Index(holders, old)] = new
	if err := p.write(uid, holders); err != nil {
		return err
	}
	delete(p.seen, old)
	p.seen[new] = uid
	return nil
}

// Share gives sandbox id the identity sandbox from leases, to hold with it:
// id is restored from from's memory, whose processes run on as that uid.
// It fails if from holds none.
func (p *Identities) Share(from, id string) (Identity, error) {
	if p.fixed != (Identity{}) {
		return p.fixed, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if uid, holders, err := p.find(id); err != nil || holders != nil {
		if err == nil && !slices.Contains(holders, from) {
			err = fmt.Errorf("share sandbox %s's identity: sandbox %s holds another (%d)", from, id, uid)
		}
		return Identity{UID: uid, GID: Reserved}, err
	}
	uid, holders, err := p.find(from)
	if err == nil && holders == nil {
		err = fmt.Errorf("share sandbox %s's identity: it holds none", from)
	}
	if err == nil {
		err = p.write(uid, append(holders, id))
	}
	if err != nil {
		return Identity{}, err
	}
	p.seen[id] = uid
	return Identity{UID: uid, GID: Reserved}, nil
}

// Release ends sandbox id's lease, once nothing of it runs or is owned by
// its identity any more; the uid is free once no sandbox holds it (Share).
// A sandbox without one is no error.
func (p *Identities) Release(id string) error {
	if p.fixed != (Identity{}) {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	uid, holders, err := p.find(id)
	if err != nil || holders == nil {
		return err
	}
	delete(p.seen, id)
	if rest := slices.DeleteFunc(holders, func(h string) bool { return h == id }); len(rest) > 0 {
		return p.write(uid, rest)
	}
	if err := os.Remove(filepath.Join(p.dir, strconv.Itoa(uid))); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("release the identity of sandbox %s: %w", id, err)
	}
	return nil
}

// write replaces uid's lease with one held by holders, whole or not at
// all: a lease is never seen empty, and so free.
func (p *Identities) write(uid int, holders []string) error {
	name := filepath.Join(p.dir, strconv.Itoa(uid))
	tmp := name + ".tmp"
	err := os.WriteFile(tmp, []byte(strings.Join(holders, "\n")), 0o600)
	if err == nil {
		err = os.Rename(tmp, name)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write the lease of identity %d: %w", uid, err)
	}
	return nil
}

// find returns the uid sandbox id leases and the sandboxes that hold it
// (nil: id leases none): the lease seen last for id if it still names
// id, else the one a look at every lease finds (they are as many as
// sandboxes run).
func (p *Identities) find(id string) (int, []string, error) {
	if uid, ok := p.seen[id]; ok {
		if holders, err := p.holders(uid); err == nil && slices.Contains(holders, id) {
			return uid, holders, nil
		}
		delete(p.seen, id)
	}
	ents, err := os.ReadDir(p.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil, nil
	}
	if err != nil {
		return 0, nil, fmt.Errorf("read the sandbox identities' leases: %w", err)
	}
	for _, e := range ents {
		uid, err := strconv.Atoi(e.Name())
		if err != nil || !InRange(uid) {
			continue
		}
		if holders, err := p.holders(uid); err == nil && slices.Contains(holders, id) {
			p.seen[id] = uid
			return uid, holders, nil
		}
	}
	return 0, nil, nil
}

// holders reads uid's lease: the sandboxes that hold it.
func (p *Identities) holders(uid int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(p.dir, strconv.Itoa(uid)))
	return strings.Fields(string(b)), err
}
