package workspace

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
)

// Directories of the data root (SPEC §1).
const (
	DirAttachments = "attachments"
	DirDocuments   = "documents"
	DirShared      = "shared"
	DirTasks       = "tasks"
	DirProjects    = "projects"
	DirRun         = "run" // runtime state and sockets; never mounted whole into a sandbox
)

// Subdirectories of shared/ and of a task directory.
var (
	sharedDirs = []string{"scripts", "data", "context", "skills", "outputs"}
	taskDirs   = []string{"context", "output", "logs"}
)

// DataRoot is the data root on disk. It is safe for concurrent use: every
// method goes through an *os.Root, which is.
type DataRoot struct {
	path   string
	root   *os.Root
	shared *os.Root
	tasks  *os.Root
}

// Open creates the data root's layout under path if needed and opens it.
func Open(path string) (*DataRoot, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("open data root %s: %w", path, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("create data root: %w", err)
	}
	root, err := os.OpenRoot(abs)
	if err != nil {
		return nil, fmt.Errorf("open data root: %w", err)
	}
	for _, d := range []string{DirAttachments, DirDocuments, DirTasks, DirProjects, DirRun} {
		if err := root.MkdirAll(d, 0o755); err != nil {
			root.Close()
			return nil, fmt.Errorf("create %s: %w", d, classify(err))
		}
	}
	for _, d := range sharedDirs {
		if err := root.MkdirAll(DirShared+"/"+d, 0o755); err != nil {
			root.Close()
			return nil, fmt.Errorf("create shared/%s: %w", d, classify(err))
		}
	}
	d := &DataRoot{path: abs, root: root}
	if d.shared, err = root.OpenRoot(DirShared); err != nil {
		d.Close()
		return nil, fmt.Errorf("open shared: %w", err)
	}
	if d.tasks, err = root.OpenRoot(DirTasks); err != nil {
		d.Close()
		return nil, fmt.Errorf("open tasks: %w", err)
	}
	return d, nil
}

// Close releases the roots.
func (d *DataRoot) Close() error {
	for _, r := range []*os.Root{d.tasks, d.shared, d.root} {
		if r != nil {
			r.Close()
		}
	}
	return nil
}

// Path returns the data root's absolute host path.
func (d *DataRoot) Path() string { return d.path }

// Root returns the data root itself.
func (d *DataRoot) Root() *os.Root { return d.root }

// Shared returns shared/, the persistent workspace every worker reads.
func (d *DataRoot) Shared() *os.Root { return d.shared }

// HostPath returns the host path of a directory of the data root, for mounts.
func (d *DataRoot) HostPath(elem ...string) string {
	return filepath.Join(append([]string{d.path}, elem...)...)
}

// TaskPath returns the host path of a task's directory.
func (d *DataRoot) TaskPath(id string) string { return filepath.Join(d.path, DirTasks, id) }

// CreateTask makes tasks/<id>/ with its context/, output/ and logs/ and
// returns a root on it. It fails with errdefs.ErrAlreadyExists if the
// directory exists. Task directories are world-writable inside so the
// sandbox's unprivileged user can write them.
func (d *DataRoot) CreateTask(id string) (*os.Root, error) {
	if err := d.tasks.Mkdir(id, 0o755); err != nil {
		return nil, fmt.Errorf("create task directory %s: %w", id, classify(err))
	}
	r, err := d.tasks.OpenRoot(id)
	if err != nil {
		return nil, fmt.Errorf("open task directory %s: %w", id, classify(err))
	}
	for _, sub := range taskDirs {
		if err := r.Mkdir(sub, 0o755); err != nil {
			r.Close()
			return nil, fmt.Errorf("create task directory %s/%s: %w", id, sub, classify(err))
		}
	}
	return r, nil
}

// OpenTask returns a root on an existing task directory, or an error of
// class errdefs.ErrNotFound.
func (d *DataRoot) OpenTask(id string) (*os.Root, error) {
	r, err := d.tasks.OpenRoot(id)
	if err != nil {
		return nil, fmt.Errorf("open task directory %s: %w", id, classify(err))
	}
	return r, nil
}

// RemoveTask removes a task directory and everything in it.
func (d *DataRoot) RemoveTask(id string) error {
	if err := d.tasks.RemoveAll(id); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove task directory %s: %w", id, classify(err))
	}
	return nil
}

// TaskIDs returns the names of the directories under tasks/, sorted.
func (d *DataRoot) TaskIDs() ([]string, error) {
	f, err := d.tasks.Open(".")
	if err != nil {
		return nil, classify(err)
	}
	defer f.Close()
	ents, err := f.ReadDir(-1)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}
