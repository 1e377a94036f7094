package library

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/corral-dev/corral/internal/clip"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/corral-dev/corral/internal/workspace"
)

var projectName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,63}$`) })

// systemDirs are refused as workspaces by name, and systemTrees with
// everything beneath them, whatever else is allowed.
var (
	systemDirs  = []string{"/", "/home", "/opt", "/root", "/run", "/srv", "/tmp", "/var"}
	systemTrees = []string{"/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/sbin", "/sys", "/usr"}
)

// ProjectName returns the project a workspace_path names: NAME,
// projects/NAME or /workspace/projects/NAME. Anything else is refused with
// the rule it breaks: a system directory or another absolute path (403:
// workspaces live under the data root's projects/), .. or a malformed
// name (400).
func ProjectName(p string) (string, error) {
	switch {
	case p == "":
		return "", errdefs.Field("workspace", "is required: a workspace name")
	case len(p) > 4096 || strings.ContainsRune(p, 0) || !utf8Valid(p):
		return "", errdefs.Field("workspace", "must be UTF-8 without NUL, at most 4096 bytes")
	}
	name := p
	if rest, ok := strings.CutPrefix(p, "/workspace/projects/"); ok {
		name = rest
	} else if rest, ok := strings.CutPrefix(p, "projects/"); ok {
		name = rest
	} else if strings.HasPrefix(p, "/") {
		clean := path.Clean(p)
		if slices.Contains(systemDirs, clean) || slices.ContainsFunc(systemTrees, func(d string) bool { return clean == d || strings.HasPrefix(clean, d+"/") }) {
			return "", &errdefs.FieldError{Field: "workspace", Err: fmt.Errorf("%q is a system directory, never a workspace: %w", clip.String(p, 64), errdefs.ErrPermissionDenied)}
		}
		return "", &errdefs.FieldError{Field: "workspace", Err: fmt.Errorf("%q is outside the data root: a workspace is a name under projects/ (directories elsewhere are not taken): %w", clip.String(p, 64), errdefs.ErrPermissionDenied)}
	}
	name = strings.TrimSuffix(name, "/")
	if strings.Contains(name, "..") || strings.Contains(name, "/") || !projectName().MatchString(name) {
		return "", errdefs.Field("workspace", fmt.Sprintf("%q is not a workspace name: lowercase letters, digits, '.', '_' and '-', at most 64, no .. or /", clip.String(name, 64)))
	}
	return name, nil
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

// openProject opens projects/<name>; a project that is not there (or is a
// link out of projects/) is ErrNotFound.
func (o *Library) openProject(name string) (*os.Root, error) {
	r, err := o.data.Root().OpenRoot(workspace.DirProjects + "/" + name)
	if err != nil {
		return nil, fmt.Errorf("no workspace %q: %w", name, errdefs.ErrNotFound)
	}
	return r, nil
}

// ProjectExists reports whether workspace name is there (a directory under
// projects/, not a link).
func (o *Library) ProjectExists(name string) bool {
	fi, err := o.data.Root().Lstat(workspace.DirProjects + "/" + name)
	return err == nil && fi.IsDir()
}

// ListProjects lists the projects, by name.
func (o *Library) ListProjects(ctx context.Context) ([]service.Project, error) {
	ents, err := fs.ReadDir(o.data.Root().FS(), workspace.DirProjects)
	if err != nil {
		return nil, fmt.Errorf("list workspaces: %w", err)
	}
	out := []service.Project{}
	for _, e := range ents {
		if !e.IsDir() || !projectName().MatchString(e.Name()) {
			continue // links and odd names are not projects
		}
		out = append(out, o.project(e.Name()))
	}
	return out, nil
}

func (o *Library) project(name string) service.Project {
	p := service.Project{Name: name, Path: workerproto.ProjectDir}
	if fi, err := o.data.Root().Stat(workspace.DirProjects + "/" + name); err == nil {
		p.Modified = fi.ModTime().UTC()
	}
	if fi, err := o.data.Root().Lstat(workspace.DirProjects + "/" + name + "/.git"); err == nil && fi.IsDir() {
		p.Git = true
	}
	return p
}

// CreateProject makes projects/<name>/, with a git repository and an empty
// first commit when asked. A name that exists is ErrAlreadyExists.
func (o *Library) CreateProject(ctx context.Context, req service.CreateProjectRequest) (service.Project, error) {
	name, err := ProjectName(req.Name)
	if err != nil {
		return service.Project{}, err
	}
	if err := o.CheckFreeSpace(); err != nil {
		return service.Project{}, err
	}
	rel := workspace.DirProjects + "/" + name
	if err := o.data.Root().Mkdir(rel, 0o755); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return service.Project{}, fmt.Errorf("workspace %q exists: %w", name, errdefs.ErrAlreadyExists)
		}
		return service.Project{}, fmt.Errorf("create workspace %s: %w", name, err)
	}
	if req.InitGit {
		if err := gitInit(ctx, o.data.HostPath(workspace.DirProjects, name)); err != nil {
			o.data.Root().RemoveAll(rel)
			return service.Project{}, err
		}
	}
	ev := projection.NewEvent(task.EventWorkspaceCreated, map[string]any{"name": name, "git": req.InitGit}, service.ActorFrom(ctx))
	if _, err := o.store.Append(ctx, "workspace/"+name, 0, ev); err != nil {
		o.data.Root().RemoveAll(rel)
		return service.Project{}, fmt.Errorf("record workspace %s: %w", name, err)
	}
	o.log.Info("workspace created", "workspace", name, "git", req.InitGit)
	return o.project(name), nil
}

// gitInit makes dir a git repository with an empty first commit.
func gitInit(ctx context.Context, dir string) error {
	git, err := exec.LookPath("git")
	if err != nil {
		return &errdefs.FieldError{Field: "init_git", Err: fmt.Errorf("git is not installed on the server (apt-get install -y git): %w", errdefs.ErrFailedPrecondition)}
	}
	for _, args := range [][]string{
		{"init", "-q", "-b", "main"},
		{"-c", "user.name=Corral", "-c", "user.email=corral@localhost", "commit", "-q", "--allow-empty", "-m", "Initial commit"},
	} {
		cmd := exec.CommandContext(ctx, git, args...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1"}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("git %s: %v: %s", args[0], err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// ListProjectFiles lists a directory of a project.
func (o *Library) ListProjectFiles(ctx context.Context, workspaceName, p string, recursive bool) ([]service.ProjectEntry, error) {
	name, err := ProjectName(workspaceName)
	if err != nil {
		return nil, err
	}
	root, err := o.openProject(name)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	ents, err := workspace.List(root, p, recursive)
	if err != nil {
		return nil, &errdefs.FieldError{Field: "path", Err: err}
	}
	if ents == nil {
		ents = []workspace.Entry{}
	}
	return ents, nil
}

// ReadProjectFile reads a file of a project, up to the read limit.
func (o *Library) ReadProjectFile(ctx context.Context, workspaceName, p string) (service.File, error) {
	name, err := ProjectName(workspaceName)
	if err != nil {
		return service.File{}, err
	}
	root, err := o.openProject(name)
	if err != nil {
		return service.File{}, err
	}
	defer root.Close()
	f, err := o.ReadFile(root, p)
	if err != nil {
		return service.File{}, &errdefs.FieldError{Field: "path", Err: err}
	}
	return f, nil
}
