package service

import (
	"time"

	"github.com/corral-dev/corral/internal/workspace"
)

// Project is a named workspace: projects/<name>/ in the data root, where
// workspace tasks work.
type Project struct {
	Name string `json:"name"`
	// Path is where a workspace task sees it.
	Path     string    `json:"path"`
	Git      bool      `json:"git"`
	Modified time.Time `json:"modified"`
}

// CreateProjectRequest is POST /api/workspaces.
type CreateProjectRequest struct {
	Name    string `json:"name"`
	InitGit bool   `json:"init_git,omitempty"`
}

// ProjectEntry is a file or directory of a project, as ListProjectFiles
// lists it.
type ProjectEntry = workspace.Entry
