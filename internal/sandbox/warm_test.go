package sandbox

import (
	"testing"
	"time"
)

func TestWarmShapeFits(t *testing.T) {
	shape := WarmShape{Name: "none", Template: Spec{
		Command: []string{"/run/corral/corral", "worker", "warm"},
		Mounts: []Mount{
			{Source: "tasks/" + WarmTaskID, Target: "/task"},
			{Source: "shared", Target: "/workspace/shared", ReadOnly: true},
		},
		Limits:  Limits{MemoryBytes: 2 << 30, CPUMillis: 2000, Pids: 512},
		Network: NetworkNone,
	}}
	task := func(mod func(*Spec)) Spec {
		s := Spec{ID: "task-1", Command: []string{"/run/corral/corral", "worker", "run-task"}, Env: []string{"K=V"}, Dir: "/task",
			Mounts: []Mount{
				{Source: "tasks/task-1", Target: "/task"},
				{Source: "shared", Target: "/workspace/shared", ReadOnly: true},
			},
			Limits:  Limits{MemoryBytes: 2 << 30, CPUMillis: 2000, Pids: 512, WallClock: time.Hour},
			Network: NetworkNone, Labels: map[string]string{"a": "b"}}
		if mod != nil {
			mod(&s)
		}
		return s
	}
	tests := []struct {
		name string
		spec Spec
		want bool
	}{
		{"the task of the shape", task(nil), true},
		{"another network", task(func(s *Spec) { s.Network = NetworkEgress }), false},
		{"another memory limit", task(func(s *Spec) { s.Limits.MemoryBytes-- }), false},
		{"another pids limit", task(func(s *Spec) { s.Limits.Pids = 0 }), false},
		{"another task's directory", task(func(s *Spec) { s.Mounts[0].Source = "tasks/task-2" }), false},
		{"a mount more", task(func(s *Spec) { s.Mounts = append(s.Mounts, Mount{Source: "x", Target: "/x"}) }), false},
		{"a mount less", task(func(s *Spec) { s.Mounts = s.Mounts[:1] }), false},
		{"shared read-write", task(func(s *Spec) { s.Mounts[1].ReadOnly = false }), false},
		{"a host directory", task(func(s *Spec) { s.Mounts[1].HostDir = true }), false},
	}
	for _, tt := range tests {
		if got := shape.Fits(tt.spec); got != tt.want {
			t.Errorf("%s: Fits = %v, want %v", tt.name, got, tt.want)
		}
	}
	if !shape.Template.Mounts[0].PerTask() || shape.Template.Mounts[1].PerTask() {
		t.Error("PerTask: want the mount with the task's id only")
	}
}
