package service

import (
	"strings"
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

// WorkspaceTaskRequest is spawn_workspace_task (seed 002): an agent working
// in a named workspace, created if it is not there. Corral's own spawn
// arguments follow the seed's five.
type WorkspaceTaskRequest struct {
	WorkspacePath   string `json:"workspace_path"`
	TaskDescription string `json:"task_description"`
	Query           string `json:"query"`
	Context         string `json:"context,omitempty"`
	InitGit         bool   `json:"init_git,omitempty"`

	Agent          string            `json:"agent,omitempty"`
	Model          string            `json:"model,omitempty"`
	Command        []string          `json:"command,omitempty"`
	TimeoutMinutes int               `json:"timeout_minutes,omitempty"`
	Runtime        string            `json:"runtime,omitempty"`
	Image          string            `json:"image,omitempty"`
	Network        string            `json:"network,omitempty"`
	ConversationID string            `json:"conversation_id,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	// OriginWorkspace and OriginConversation: see SpawnRequest.
	OriginWorkspace    string `json:"origin_workspace,omitempty"`
	OriginConversation string `json:"origin_conversation,omitempty"`
}

// Spawn is the task req asks for, in workspace name: the description,
// the query and the context make its prompt.
func (req WorkspaceTaskRequest) Spawn() SpawnRequest {
	desc := strings.TrimSpace(req.TaskDescription) + "\n\n" + strings.TrimSpace(req.Query)
	if c := strings.TrimSpace(req.Context); c != "" {
		desc += "\n\nContext from the conversation that asked:\n\n" + c
	}
	return SpawnRequest{
		TaskDescription: desc, Workspace: req.WorkspacePath,
		Agent: req.Agent, Model: req.Model, Command: req.Command, TimeoutMinutes: minutesOrDefault(req.TimeoutMinutes),
		Runtime: req.Runtime, Image: req.Image, Network: req.Network,
		ConversationID: req.ConversationID, Labels: req.Labels,
		OriginWorkspace: req.OriginWorkspace, OriginConversation: req.OriginConversation,
	}
}

// minutesOrDefault is n, or nil (the server's default) for 0.
func minutesOrDefault(n int) *int {
	if n == 0 {
		return nil
	}
	return &n
}
