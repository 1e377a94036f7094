// Package orchestrator implements Corral's use cases (service.Service) —
// spawn a task, read its result, cancel it, follow its logs and events,
// read and write the shared workspace, attachments, documents and skills. It also gives the scheduler what it
// needs to build a task's sandbox and to read a finished task's result.
package orchestrator
