// Package orchestrator implements Corral's task use cases (service.Tasks):
// spawn a task (placing its context through the library), run a one-shot
// code_execute, read its result, cancel it, follow its logs and events.
package orchestrator
