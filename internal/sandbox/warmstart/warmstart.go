// Package warmstart is how a runtime hands a task to a warm sandbox: a
// sandbox started ahead of need, whose main process waits on descriptor FD
// for the Start message of the one task that claims it.
//
// The runtime keeps the pipe's write end; the sandbox's main process
// inherits the read end as FD, reads one message to EOF and runs it. EOF
// with nothing read (the runtime closed the pipe, or the server died)
// means no task will come: the process exits and the sandbox ends, so a
// warm sandbox never outlives the server that made it and is never
// reattached.
//
// The main process also inherits AckFD, a file of the runtime's, and
// writes Ack to it as soon as it has read anything, before it runs
// anything of the task, then closes it (so nothing the task runs can
// write it). The runtime, which may have died between handing the sandbox
// to a task and writing its start, tells from it after a restart whether
// the sandbox's end is its task's or that of a worker that never had one.
package warmstart

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// FD is the descriptor a warm sandbox's main process reads its Start from.
const FD = 5

// AckFD is the descriptor a warm sandbox's main process writes Ack to once
// it has read a start, before it runs any of it.
const AckFD = 6

// Ack is what a warm sandbox's main process writes to AckFD.
const Ack = "started\n"

// Acknowledge writes Ack to f and closes it. A main process that cannot
// must not run its start: the runtime would take the task for one that
// never started, and start it again.
func Acknowledge(f io.WriteCloser) error {
	_, err := io.WriteString(f, Ack)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("warm start: acknowledge: %w", err)
	}
	return nil
}

// MaxBytes bounds a Start message: a task's argv and environment.
const MaxBytes = 1 << 20

// ErrNoTask says the pipe closed with no message: no task claimed the
// sandbox.
var ErrNoTask = errors.New("the warm sandbox was released without a task")

// Start is the task a warm sandbox runs: what a cold sandbox's Spec would
// have started as its main process.
type Start struct {
	Argv []string `json:"argv"`
	Env  []string `json:"env"` // the whole environment, KEY=VALUE; holds secrets
	Dir  string   `json:"dir"`
}

// Send writes s to w; the caller closes w after it.
func Send(w io.Writer, s Start) error {
	if len(s.Argv) == 0 {
		return errors.New("warm start: empty argv")
	}
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	if len(b) > MaxBytes {
		return fmt.Errorf("warm start: %d bytes, over %d", len(b), MaxBytes)
	}
	_, err = w.Write(b)
	return err
}

// Receive reads one Start from r to EOF. It returns ErrNoTask if r ends
// with nothing in it.
func Receive(r io.Reader) (Start, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxBytes+1))
	if err != nil {
		return Start{}, fmt.Errorf("warm start: read: %w", err)
	}
	if len(b) == 0 {
		return Start{}, ErrNoTask
	}
	if len(b) > MaxBytes {
		return Start{}, fmt.Errorf("warm start: over %d bytes", MaxBytes)
	}
	var s Start
	if err := json.Unmarshal(b, &s); err != nil {
		return Start{}, fmt.Errorf("warm start: decode: %w", err)
	}
	if len(s.Argv) == 0 {
		return Start{}, errors.New("warm start: empty argv")
	}
	return s, nil
}

// Overlay is the environment of a start whose Env is env, run where the
// environment was base (an image's): env's variables, and base's that env
// does not set.
func Overlay(base, env []string) []string {
	set := map[string]bool{}
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		set[k] = true
	}
	var out []string
	for _, kv := range base {
		if k, _, _ := strings.Cut(kv, "="); !set[k] {
			out = append(out, kv)
		}
	}
	return append(out, env...)
}
