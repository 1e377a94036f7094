package sandbox

import (
	"context"
	"slices"
	"strings"
	"time"
)

// WarmTaskID stands for a task's id in the mount sources of a WarmShape's
// Template: a mount whose Source holds it is the task's own (its task
// directory, its egress proxy's directory), a directory that does not
// exist until the task does.
const WarmTaskID = "{task-id}"

// Warmer is a Runtime that keeps sandboxes warm: started ahead of need,
// idle, holding nothing of any task. Create hands a spec that fits a warm
// sandbox's shape to one of them, and a warm sandbox serves one task only:
// after it, it is destroyed like any other.
type Warmer interface {
	// KeepWarm keeps p.Size sandboxes of each shape warm until ctx ends,
	// then destroys those not claimed and returns. Warm sandboxes left by
	// an earlier process are destroyed, never reattached.
	KeepWarm(ctx context.Context, p WarmPolicy) error
	// WarmStats reports each shape's pool.
	WarmStats() []WarmStats
}

// WarmPolicy says which sandboxes to keep warm and how many.
type WarmPolicy struct {
	// Size is how many sandboxes of each shape to keep ready.
	Size int
	// Idle is how long a pool keeps its sandboxes without a claim; then it
	// destroys them and refills at the next task of its shape. 0: never.
	Idle time.Duration
	// Shapes are the kinds of sandbox to keep warm.
	Shapes []WarmShape
	// MaxSandboxes bounds the warm sandboxes of all shapes together, those
	// ready and those being started; 0: Size of each.
	MaxSandboxes int
	// MaxMemory bounds the sum of their memory limits (each counts for
	// its shape's Limits.MemoryBytes, the most it may take once claimed);
	// 0: no bound.
	MaxMemory int64
	// Pressure, if set, reports whether the host is short of memory: the
	// pools then destroy their ready sandboxes, before any task's memory
	// is at stake, and fill again at their next claim or miss.
	Pressure func() bool
}

// WarmShape is one kind of warm sandbox. Template is the Spec of a task
// of this shape with WarmTaskID for the task's id in its mount sources;
// its Command, Env and Dir are the warm sandbox's main process's, which
// waits for its task (package sandbox/warmstart) and runs the task's
// Command with the task's Env in the task's Dir. Its ID is unused.
type WarmShape struct {
	Name     string
	Template Spec
}

// Fits reports whether spec is of shape w: the same network, memory, CPU
// and pids limits, and the same mounts, where the task's own are w's with
// spec.ID for WarmTaskID. Command, Env, Dir, Image, Labels and the
// wall-clock limit may differ.
func (w WarmShape) Fits(spec Spec) bool {
	t := w.Template
	lim := func(l Limits) Limits { l.WallClock = 0; return l }
	if spec.Network != t.Network || lim(spec.Limits) != lim(t.Limits) {
		return false
	}
	return slices.EqualFunc(spec.Mounts, t.Mounts, func(m, tm Mount) bool {
		tm.Source = strings.ReplaceAll(tm.Source, WarmTaskID, spec.ID)
		return m == tm
	})
}

// PerTask reports whether m, a mount of a Template, is the task's own.
func (m Mount) PerTask() bool { return strings.Contains(m.Source, WarmTaskID) }

// WarmStats is one pool's state.
type WarmStats struct {
	Runtime string `json:"runtime"`
	Shape   string `json:"shape"`
	// Ready sandboxes wait for a task; Target is how many the pool keeps
	// (0 while it is shrunk after an idle time).
	Ready  int `json:"ready"`
	Target int `json:"target"`
	// Claims are the tasks a warm sandbox took; Misses the tasks of this
	// shape that found none ready and started cold.
	Claims uint64 `json:"claims"`
	Misses uint64 `json:"misses"`
	// Started and Failed count the warm sandboxes the pool started and
	// those it could not; Destroyed those it destroyed unclaimed.
	Started   uint64 `json:"started"`
	Failed    uint64 `json:"failed"`
	Destroyed uint64 `json:"destroyed"`
}
