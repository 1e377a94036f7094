// Package library holds the use cases over what tasks share and leave
// behind: the shared/ workspace's files, attachments, the document index
// and its notes, skills, save_to_shared, and the retention sweep. A
// Library implements service.Library; the orchestrator, which implements
// service.Tasks, asks it to place context into a new task's directory.
package library

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/attachment"
	"github.com/corral-dev/corral/internal/document"
	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workspace"
)

// Limits bound what callers and workers may put in the library.
type Limits struct {
	MaxTaskDirBytes int64
	MaxContextBytes int64
	MaxReadBytes    int64 // file contents returned by read_workspace and results
	MaxWriteBytes   int64 // content accepted by write_workspace
	MaxSharedBytes  int64 // total size of shared/; 0 means no limit
	MinFreeBytes    int64 // the data root's free-space floor; 0 means none
}

// Options configure a Library.
type Options struct {
	Store eventstore.Store
	Tasks *projection.Tasks
	Data  *workspace.DataRoot
	// Projects are the named workspaces; nil: projects/ of the data root
	// alone.
	Projects *workspace.Projects
	Limits   Limits
	// Documents is the document index; nil turns documents and notes off.
	Documents *document.Index
	// Attachments stores attachments; nil turns them off.
	Attachments *attachment.Store
	// Retention says how long ended tasks' directories and unused
	// attachments are kept, and how often the sweeper looks.
	Retention Retention
	// Now is the clock of retention and save_to_shared; nil means time.Now.
	Now func() time.Time
}

// Library implements service.Library. It is safe for concurrent use.
type Library struct {
	opts  Options
	store eventstore.Store
	tasks *projection.Tasks
	data  *workspace.DataRoot
	log   *slog.Logger

	saving    keyedMutex // held by a task's save_to_shared copy, and by retention removing its directory
	scriptsMu sync.Mutex // serialises choosing names in shared/scripts/
	gcMu      sync.Mutex // serialises retention sweeps
	skillMu   sync.Mutex // serialises create_skill, so two creates of one name cannot both pass the check

	// For tests: saveTime replaces maxSaveTime when set, and copyHook is
	// called as each save_to_shared copy starts, with the copy's context.
	saveTime time.Duration
	copyHook func(ctx context.Context, id string)
}

var _ service.Library = (*Library)(nil)

// New returns a Library.
func New(opts Options, log *slog.Logger) *Library {
	if opts.Projects == nil {
		opts.Projects, _ = workspace.NewProjects(opts.Data, nil) // no roots: nothing to refuse
	}
	return &Library{opts: opts, store: opts.Store, tasks: opts.Tasks, data: opts.Data, log: log}
}

// ContextFile is one file placed for a task that prompt.md lists: its name
// where the worker finds it, and a short description (a type and size, a
// title, a summary).
type ContextFile struct {
	Name, About string
}

// keyedMutex is a mutex per key, held only while someone holds it.
type keyedMutex struct {
	mu   sync.Mutex
	keys map[string]*keyedEntry
}

type keyedEntry struct {
	mu   sync.Mutex
	refs int
}

// lock locks key and returns its unlock.
func (k *keyedMutex) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.keys == nil {
		k.keys = map[string]*keyedEntry{}
	}
	e := k.keys[key]
	if e == nil {
		e = &keyedEntry{}
		k.keys[key] = e
	}
	e.refs++
	k.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.keys, key)
		}
		k.mu.Unlock()
	}
}

// task returns a task the library's calls name (a task's output file,
// a skill's source), checking its id first.
func (o *Library) task(id string) (task.Task, error) {
	if err := task.CheckID(id); err != nil {
		return task.Task{}, err
	}
	return o.tasks.Get(id)
}
