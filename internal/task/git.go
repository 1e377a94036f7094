package task

// EventWorkspaceGit records, once a workspace task's sandbox is gone, what
// it left in the workspace's repository that git would run as the
// workspace's owner: hooks created or changed (disabled unless
// workspaces.allow_hooks) and .git/config keys that run programs. Recorded
// only when there is something; Task.WorkspaceGit folds it.
const EventWorkspaceGit = "workspace_git_checked"

// WorkspaceGit is EventWorkspaceGit's payload and Task.WorkspaceGit.
type WorkspaceGit struct {
	// Hooks are the files of .git/hooks the task created or changed
	// (executable ones, and links).
	Hooks []string `json:"hooks,omitempty"`
	// HooksDisabled: they lost their execute bits (a link was removed).
	HooksDisabled bool `json:"hooks_disabled,omitempty"`
	// Config are the keys of .git/config that run a program, when the
	// task changed that file.
	Config []string `json:"config,omitempty"`
}
