// Package e2e holds Corral's end-to-end suites: a whole server (app.New)
// on a fresh data root, driven over HTTP, MCP and the CLI against the real
// parts — bubblewrap and gVisor sandboxes, the worker binary, the agent
// CLIs against scripted model endpoints, SIGKILL mid-task. They need the
// integration build tag and, for most, root. The package has no code of
// its own.
package e2e
