package workspace

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"unicode/utf8"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/errdefs"
)

// projectName is a workspace name under the data root's projects/.
var projectName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`) })

// rootChild is the name of a workspace directly under an operator's root:
// an existing repository's directory may have capitals.
var rootChild = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`) })

// systemDirs are refused as workspaces and workspace roots by name, and
// systemTrees with everything beneath them.
var (
	systemDirs  = []string{"/", "/home", "/opt", "/root", "/run", "/srv", "/tmp", "/var", "/mnt", "/media"}
	systemTrees = []string{"/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/sbin", "/sys", "/usr"}
)

// SystemDir reports whether p (absolute, clean) is a system directory or
// lies in a system tree: never a workspace or a workspace root.
func SystemDir(p string) bool {
	return slices.Contains(systemDirs, p) || slices.ContainsFunc(systemTrees, func(d string) bool { return p == d || strings.HasPrefix(p, d+"/") })
}

// Projects resolves named workspaces: NAME, the data root's
// projects/NAME/, and directories directly under the roots an operator
// lists (workspaces.roots), named by their absolute path. It is safe for
// concurrent use.
type Projects struct {
	data  *DataRoot
	roots []projectRoot
}

type projectRoot struct {
	path string // as configured: absolute, clean
	real string // with symbolic links resolved
}

// NewProjects returns the workspaces of data and of roots. Each root must
// be an existing directory, absolute, not a system directory, and neither
// inside another root or the data root nor holding one.
func NewProjects(data *DataRoot, roots []string) (*Projects, error) {
	p := &Projects{data: data}
	taken := []string{}
	if real, err := filepath.EvalSymlinks(data.Path()); err == nil {
		taken = append(taken, real)
	}
	for _, r := range roots {
		if !filepath.IsAbs(r) || filepath.Clean(r) != r || SystemDir(r) {
			return nil, fmt.Errorf("workspaces.roots: %q must be an absolute, clean path and not a system directory", clip.String(r, 256))
		}
		real, err := filepath.EvalSymlinks(r)
		if err != nil {
			return nil, fmt.Errorf("workspaces.roots: %w", err)
		}
		if fi, err := os.Stat(real); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("workspaces.roots: %s is not a directory", r)
		}
		if SystemDir(real) {
			return nil, fmt.Errorf("workspaces.roots: %s is %s, a system directory", r, real)
		}
		for _, t := range taken {
			if within(real, t) || within(t, real) {
				return nil, fmt.Errorf("workspaces.roots: %s overlaps %s (the data root or another root); roots must be apart", r, t)
			}
		}
		taken = append(taken, real)
		p.roots = append(p.roots, projectRoot{path: r, real: real})
	}
	return p, nil
}

// within reports whether p is dir or lies under it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// Project is a resolved workspace.
type Project struct {
	// Name is what tasks record and callers pass again: NAME for
	// projects/NAME, or the absolute path under a root.
	Name string
	// Dir is the workspace's directory on the server's host.
	Dir string
	// rel is projects/NAME for a workspace in the data root, "" for one
	// under a root.
	rel string
}

// InDataRoot reports whether the workspace is projects/NAME of the data
// root (false: under an operator's root).
func (pr Project) InDataRoot() bool { return pr.rel != "" }

// Source is the workspace as a sandbox mount's source: projects/NAME,
// relative to the data root, or the absolute host directory.
func (pr Project) Source() string {
	if pr.rel != "" {
		return pr.rel
	}
	return pr.Dir
}

// HomeKey names the workspace's own directories in the data root (its
// agents' HOME): NAME, or a digest of the path for one under a root.
func (pr Project) HomeKey() string {
	if pr.rel != "" {
		return path.Base(pr.rel)
	}
	sum := sha256.Sum256([]byte(pr.Name))
	return "root-" + hex.EncodeToString(sum[:10])
}

// Resolve returns the workspace p names: NAME, projects/NAME,
// /workspace/projects/NAME, or an absolute path directly under one of the
// roots. Anything else is refused with the rule it breaks, without looking
// at whether the workspace exists: a system directory or an absolute path
// under no root (403), a symbolic link (403), .. or a malformed name
// (400).
func (w *Projects) Resolve(p string) (Project, error) {
	switch {
	case p == "":
		return Project{}, errdefs.Field("workspace", "is required: a workspace name")
	case len(p) > 4096 || strings.ContainsRune(p, 0) || !utf8.ValidString(p):
		return Project{}, errdefs.Field("workspace", "must be UTF-8 without NUL, at most 4096 bytes")
	case slices.Contains(strings.Split(p, "/"), ".."):
		return Project{}, errdefs.Field("workspace", fmt.Sprintf("%q goes up with ..: a workspace is a name or a directory directly under a workspace root", clip.String(p, 64)))
	}
	name := p
	if rest, ok := strings.CutPrefix(p, "/workspace/projects/"); ok {
		name = rest
	} else if rest, ok := strings.CutPrefix(p, "projects/"); ok {
		name = rest
	} else if strings.HasPrefix(p, "/") {
		return w.underRoot(path.Clean(p), p)
	}
	name = strings.TrimSuffix(name, "/")
	if !projectName().MatchString(name) {
		return Project{}, errdefs.Field("workspace", fmt.Sprintf("%q is not a workspace name: lowercase letters, digits, '.', '_' and '-', at most 64, no .. or /", clip.String(name, 64)))
	}
	if Reserved(name) {
		return Project{}, errdefs.Field("workspace", fmt.Sprintf("%q is a name Windows reserves (con, prn, aux, nul, com1-9, lpt1-9)", name))
	}
	rel := DirProjects + "/" + name
	return Project{Name: name, Dir: w.data.HostPath(DirProjects, name), rel: rel}, nil
}

// underRoot resolves clean, an absolute path, as a directory directly
// under one of the roots.
func (w *Projects) underRoot(clean, asked string) (Project, error) {
	denied := func(format string, args ...any) (Project, error) {
		return Project{}, &errdefs.FieldError{Field: "workspace", Err: fmt.Errorf(format+": %w", append(args, errdefs.ErrPermissionDenied)...)}
	}
	q := clip.String(asked, 64)
	if SystemDir(clean) {
		return denied("%q is a system directory, never a workspace", q)
	}
	for _, r := range w.roots {
		rest, ok := strings.CutPrefix(clean, r.path+"/")
		if !ok {
			continue
		}
		if !rootChild().MatchString(rest) {
			return Project{}, errdefs.Field("workspace", fmt.Sprintf("%q must be a directory directly under the workspace root %s (letters, digits, '.', '_' and '-'); list a deeper directory in workspaces.roots to use what is under it", q, r.path))
		}
		dir := filepath.Join(r.real, rest)
		fi, err := os.Lstat(dir)
		switch {
		case err == nil && fi.Mode()&fs.ModeSymlink != 0:
			return denied("%q is a symbolic link; a workspace under a root must be a directory there, not a link (which could lead out of the root)", q)
		case err == nil && !fi.IsDir():
			return Project{}, errdefs.Field("workspace", fmt.Sprintf("%q is not a directory", q))
		case err != nil && !errors.Is(err, fs.ErrNotExist):
			return Project{}, fmt.Errorf("workspace %s: %w", q, err)
		}
		return Project{Name: clean, Dir: dir}, nil
	}
	if len(w.roots) == 0 {
		return denied("%q is outside the data root: a workspace is a name under projects/, and no workspaces.roots are configured for directories elsewhere", q)
	}
	roots := make([]string, len(w.roots))
	for i, r := range w.roots {
		roots[i] = r.path
	}
	return denied("%q is outside the data root and under none of the workspace roots (%s)", q, strings.Join(roots, ", "))
}

// Check reports, from one look at it, whether the workspace's directory
// is there: nil for a directory, ErrNotFound when nothing is, and
// ErrPermissionDenied for a symbolic link (which could lead out of the
// root) or anything else that took the directory's place.
func (w *Projects) Check(pr Project) error {
	_, err := w.check(pr)
	return err
}

func (w *Projects) check(pr Project) (fs.FileInfo, error) {
	fi, err := os.Lstat(pr.Dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("no workspace %q: %w", pr.Name, errdefs.ErrNotFound)
	case err != nil:
		return nil, fmt.Errorf("workspace %q: %w", pr.Name, err)
	case fi.Mode()&fs.ModeSymlink != 0:
		return nil, fmt.Errorf("workspace %q is a symbolic link, not a directory (a link could lead out of the root): %w", pr.Name, errdefs.ErrPermissionDenied)
	case !fi.IsDir():
		return nil, fmt.Errorf("workspace %q is not a directory: %w", pr.Name, errdefs.ErrPermissionDenied)
	}
	return fi, nil
}

// Open opens the workspace's directory as a root no path escapes, refused
// as Check refuses it. The directory opened is the one Check saw: one
// swapped for a link between the look and the open is refused, not
// followed.
func (w *Projects) Open(pr Project) (*os.Root, error) {
	fi, err := w.check(pr)
	if err != nil {
		return nil, err
	}
	var root *os.Root
	if pr.rel != "" {
		root, err = w.data.Root().OpenRoot(pr.rel)
	} else {
		root, err = os.OpenRoot(pr.Dir)
	}
	if err != nil {
		return nil, err
	}
	if got, err := root.Stat("."); err != nil || !os.SameFile(fi, got) {
		root.Close()
		return nil, fmt.Errorf("workspace %q was replaced while it was opened: %w", pr.Name, errdefs.ErrPermissionDenied)
	}
	return root, nil
}

// Create makes the workspace's directory: under a root, owned by the
// root's owner, who gets what tasks write there. One that exists is
// ErrAlreadyExists.
func (w *Projects) Create(pr Project) error {
	var err error
	if pr.rel != "" {
		err = w.data.Root().Mkdir(pr.rel, 0o755)
	} else {
		err = os.Mkdir(pr.Dir, 0o755)
		if err == nil {
			if fi, serr := os.Stat(filepath.Dir(pr.Dir)); serr == nil {
				if st, ok := fi.Sys().(*syscall.Stat_t); ok {
					err = os.Lchown(pr.Dir, int(st.Uid), int(st.Gid))
				}
			}
		}
	}
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("workspace %q exists: %w", pr.Name, errdefs.ErrAlreadyExists)
	}
	if err != nil {
		return fmt.Errorf("create workspace %s: %w", pr.Name, err)
	}
	return nil
}

// Remove undoes Create (a workspace whose set-up failed).
func (w *Projects) Remove(pr Project) error {
	if pr.rel != "" {
		return w.data.Root().RemoveAll(pr.rel)
	}
	return os.RemoveAll(pr.Dir)
}

// List returns every workspace: the directories of projects/ with a
// workspace name, then those directly under each root. Links and odd
// names are not workspaces.
func (w *Projects) List() ([]Project, error) {
	ents, err := fs.ReadDir(w.data.Root().FS(), DirProjects)
	if err != nil {
		return nil, fmt.Errorf("list workspaces: %w", err)
	}
	out := []Project{}
	for _, e := range ents {
		if e.IsDir() && projectName().MatchString(e.Name()) {
			out = append(out, Project{Name: e.Name(), Dir: w.data.HostPath(DirProjects, e.Name()), rel: DirProjects + "/" + e.Name()})
		}
	}
	for _, r := range w.roots {
		ents, err := os.ReadDir(r.real)
		if err != nil {
			return nil, fmt.Errorf("list workspaces under %s: %w", r.path, err)
		}
		for _, e := range ents {
			if e.IsDir() && rootChild().MatchString(e.Name()) {
				out = append(out, Project{Name: r.path + "/" + e.Name(), Dir: filepath.Join(r.real, e.Name())})
			}
		}
	}
	return out, nil
}
