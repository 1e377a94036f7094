package library

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/projection"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/corral-dev/corral/internal/workspace"
)

// ResolveWorkspace returns the workspace p names (see
// workspace.Projects.Resolve).
func (o *Library) ResolveWorkspace(p string) (workspace.Project, error) {
	return o.opts.Projects.Resolve(p)
}

// CheckProject reports whether workspace pr is there, a directory (see
// workspace.Projects.Check).
func (o *Library) CheckProject(pr workspace.Project) error { return o.opts.Projects.Check(pr) }

// ListProjects lists the workspaces: projects/ by name, then those under
// the operator's roots.
func (o *Library) ListProjects(ctx context.Context) ([]service.Project, error) {
	prs, err := o.opts.Projects.List()
	if err != nil {
		return nil, err
	}
	out := make([]service.Project, len(prs))
	for i, pr := range prs {
		out[i] = project(pr)
	}
	return out, nil
}

func project(pr workspace.Project) service.Project {
	p := service.Project{Name: pr.Name, Path: workerproto.ProjectDir}
	if fi, err := os.Stat(pr.Dir); err == nil {
		p.Modified = fi.ModTime().UTC()
	}
	if fi, err := os.Lstat(filepath.Join(pr.Dir, ".git")); err == nil && fi.IsDir() {
		p.Git = true
	}
	return p
}

// CreateProject makes a workspace, projects/<name>/ or a directory under
// an operator's root, with a git repository and an empty first commit
// when asked. A workspace that exists is ErrAlreadyExists.
func (o *Library) CreateProject(ctx context.Context, req service.CreateProjectRequest) (service.Project, error) {
	pr, err := o.opts.Projects.Resolve(req.Name)
	if err != nil {
		return service.Project{}, err
	}
	if err := o.CheckFreeSpace(); err != nil {
		return service.Project{}, err
	}
	if err := o.opts.Projects.Create(pr); err != nil {
		return service.Project{}, err
	}
	if req.InitGit {
		if err := gitInit(ctx, pr.Dir); err != nil {
			o.opts.Projects.Remove(pr)
			return service.Project{}, err
		}
	}
	ev := projection.NewEvent(task.EventWorkspaceCreated, map[string]any{"name": pr.Name, "git": req.InitGit}, service.ActorFrom(ctx))
	if _, err := o.store.Append(ctx, "workspace/"+pr.HomeKey(), 0, ev); err != nil {
		o.opts.Projects.Remove(pr)
		return service.Project{}, fmt.Errorf("record workspace %s: %w", pr.Name, err)
	}
	o.log.Info("workspace created", "workspace", pr.Name, "git", req.InitGit)
	return project(pr), nil
}

// gitInit makes dir a git repository with an empty first commit, as the
// owner of dir (a person's, under an operator's root).
func gitInit(ctx context.Context, dir string) error {
	git, err := exec.LookPath("git")
	if err != nil {
		return &errdefs.FieldError{Field: "init_git", Err: fmt.Errorf("git is not installed on the server (apt-get install -y git): %w", errdefs.ErrFailedPrecondition)}
	}
	var as *syscall.SysProcAttr
	if fi, err := os.Stat(dir); err == nil && os.Geteuid() == 0 {
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 {
			as = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: st.Uid, Gid: st.Gid}}
		}
	}
	for _, args := range [][]string{
		{"init", "-q", "-b", "main"},
		{"-c", "user.name=Corral", "-c", "user.email=corral@localhost", "commit", "-q", "--allow-empty", "-m", "Initial commit"},
	} {
		cmd := exec.CommandContext(ctx, git, args...)
		cmd.Dir = dir
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent", "GIT_CONFIG_NOSYSTEM=1"}
		cmd.SysProcAttr = as
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("git %s: %v: %s", args[0], err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// ListProjectFiles lists a directory of a project.
func (o *Library) ListProjectFiles(ctx context.Context, workspaceName, p string, recursive bool) ([]service.ProjectEntry, error) {
	root, err := o.openProject(workspaceName)
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
	root, err := o.openProject(workspaceName)
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

// openProject opens the workspace name names.
func (o *Library) openProject(name string) (*os.Root, error) {
	pr, err := o.opts.Projects.Resolve(name)
	if err != nil {
		return nil, err
	}
	return o.opts.Projects.Open(pr)
}
