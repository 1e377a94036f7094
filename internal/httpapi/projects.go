package httpapi

import (
	"context"
	"net/http"
	"net/url"

	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/workspace"
)

func (s *Server) listProjects(w http.ResponseWriter, r *http.Request) error {
	ps, err := s.svc.Library.ListProjects(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"workspaces": ps})
	return nil
}

func (s *Server) createProject(w http.ResponseWriter, r *http.Request) error {
	req, err := decodeBody[service.CreateProjectRequest](s, r)
	if err != nil {
		return err
	}
	p, err := s.svc.Library.CreateProject(r.Context(), req)
	if err != nil {
		return err
	}
	w.Header().Set("Location", projectBase(p.Name))
	writeJSON(w, http.StatusCreated, p)
	return nil
}

// projectFiles serves GET /api/workspaces/{name}/files/{path...} as GET
// /api/workspace/{path...} serves shared/.
func (s *Server) projectFiles(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	return serveFiles(w, r, r.PathValue("path"),
		func(ctx context.Context, p string, rec bool) ([]workspace.Entry, error) {
			return s.svc.Library.ListProjectFiles(ctx, name, p, rec)
		},
		func(ctx context.Context, p string) (service.File, error) {
			return s.svc.Library.ReadProjectFile(ctx, name, p)
		})
}

// ListProjects lists the named workspaces.
func (c *Client) ListProjects(ctx context.Context) ([]service.Project, error) {
	var r struct {
		Workspaces []service.Project `json:"workspaces"`
	}
	err := c.call(ctx, http.MethodGet, "/api/workspaces", nil, &r)
	return r.Workspaces, err
}

// CreateProject makes a named workspace.
func (c *Client) CreateProject(ctx context.Context, req service.CreateProjectRequest) (service.Project, error) {
	var p service.Project
	err := c.call(ctx, http.MethodPost, "/api/workspaces", req, &p)
	return p, err
}

func projectBase(name string) string { return "/api/workspaces/" + url.PathEscape(name) + "/files/" }

// ListProjectFiles lists a directory of a named workspace.
func (c *Client) ListProjectFiles(ctx context.Context, name, p string, recursive bool) ([]service.ProjectEntry, error) {
	return c.listFiles(ctx, projectBase(name), p, recursive)
}

// ReadProjectFile reads a file of a named workspace.
func (c *Client) ReadProjectFile(ctx context.Context, name, p string) (service.File, error) {
	return c.readFile(ctx, projectBase(name), p)
}
