// Package placement holds one record per runtime a task or a session can
// be placed on: its kind, its sandbox and what the server knows of it (why
// it takes no work, how its sandboxes reach the server), and the mounts
// every Corral sandbox starts from. The server (internal/app) builds one
// Set; the workloads (taskrun, session) and the scheduler read it.
package placement

import (
	"github.com/corral-dev/corral/internal/rtkind"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/corral-dev/corral/internal/workspace"
)

// Runtime is one runtime's record.
type Runtime struct {
	rtkind.Kind
	// Sandbox makes its sandboxes; nil when it is not configured.
	Sandbox sandbox.Runtime
	// Unavailable says why it takes no work ("" if it takes it).
	Unavailable string
	// ServerURL is, for a remote kind, the server's URL its sandboxes
	// post their webhooks to (a host's sandboxes use the server's socket).
	ServerURL string
	// EgressAddr is, for a remote kind, where its sandboxes reach the
	// egress proxies; NoEgress says why there is none ("" if there is).
	EgressAddr, NoEgress string
}

// Set is the records of every kind of runtime.
type Set struct {
	byName map[string]*Runtime
}

// NewSet returns a Set of rs, and a record of its kind alone (no sandbox,
// unavailable) for every other kind of rtkind.Kinds.
func NewSet(rs ...*Runtime) *Set {
	s := &Set{byName: map[string]*Runtime{}}
	for _, r := range rs {
		s.byName[r.Name] = r
	}
	for _, k := range rtkind.Kinds {
		if s.byName[k.Name] == nil {
			s.byName[k.Name] = &Runtime{Kind: k, Unavailable: "not configured"}
		}
	}
	return s
}

// Get returns the record of runtime name; ok is false for a name that is
// no runtime. A nil Set (none given) holds every kind, unconfigured.
func (s *Set) Get(name string) (r *Runtime, ok bool) {
	if s == nil {
		k, ok := rtkind.Of(name)
		return &Runtime{Kind: k, Unavailable: "not configured"}, ok
	}
	r, ok = s.byName[name]
	return r, ok
}

// Usable returns the record of runtime name if it takes work.
func (s *Set) Usable(name string) *Runtime {
	if r, ok := s.Get(name); ok && r.Sandbox != nil && r.Unavailable == "" {
		return r
	}
	return nil
}

// Sandboxes are the configured runtimes' sandboxes, by name; none for a
// nil Set (a server whose start failed before it had one closes it).
func (s *Set) Sandboxes() map[string]sandbox.Runtime {
	out := map[string]sandbox.Runtime{}
	if s == nil {
		return out
	}
	for name, r := range s.byName {
		if r.Sandbox != nil {
			out[name] = r.Sandbox
		}
	}
	return out
}

// Unavailable says for every runtime why it takes no work ("" if it
// takes it).
func (s *Set) Unavailable() map[string]string {
	out := map[string]string{}
	for name, r := range s.byName {
		out[name] = r.Unavailable
		if r.Sandbox == nil && r.Unavailable == "" {
			out[name] = "not configured"
		}
	}
	return out
}

// NoEgress says, for the runtimes whose sandboxes cannot have a network
// policy but none, why.
func (s *Set) NoEgress() map[string]string {
	out := map[string]string{}
	for name, r := range s.byName {
		if r.NoEgress != "" {
			out[name] = r.NoEgress
		}
	}
	return out
}

// Base is where the data root holds what every Corral sandbox mounts
// besides its own directory (paths relative to the data root).
type Base struct {
	// BinDir holds corral and corral-worker; SocketDir the server's unix
	// socket, which a host's sandboxes dial.
	BinDir, SocketDir string
}

// Mounts are the mounts every sandbox gets besides its own directory:
// shared/ read-only, corral and corral-worker and, on this host (not
// remote), the server's socket directory. Each runtime decides how to
// expose them.
func (b Base) Mounts(remote bool) []sandbox.Mount {
	mounts := []sandbox.Mount{
		{Source: workspace.DirShared, Target: workerproto.SharedDir, ReadOnly: true},
		{Source: b.BinDir + "/" + workerproto.CorralName, Target: workerproto.CorralBinary, ReadOnly: true},
		{Source: b.BinDir + "/" + workerproto.WorkerName, Target: workerproto.WorkerBinary, ReadOnly: true},
	}
	if !remote {
		mounts = append(mounts, sandbox.Mount{Source: b.SocketDir, Target: workerproto.SocketDir, ReadOnly: true})
	}
	return mounts
}

// EgressMount mounts an egress proxy's directory (relative to the data
// root) where the worker's relay dials it.
func EgressMount(dir string) sandbox.Mount {
	return sandbox.Mount{Source: dir, Target: workerproto.EgressDir, ReadOnly: true}
}
