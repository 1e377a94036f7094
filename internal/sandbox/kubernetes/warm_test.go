package kubernetes

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The pools shrink when any node reports MemoryPressure, and only then.
func TestMemoryPressure(t *testing.T) {
	node := func(conds ...corev1.NodeCondition) corev1.Node {
		return corev1.Node{Status: corev1.NodeStatus{Conditions: conds}}
	}
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue}
	calm := corev1.NodeCondition{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse}
	pressed := corev1.NodeCondition{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionTrue}
	disk := corev1.NodeCondition{Type: corev1.NodeDiskPressure, Status: corev1.ConditionTrue}
	for _, tt := range []struct {
		name  string
		nodes []corev1.Node
		want  bool
	}{
		{"no nodes", nil, false},
		{"calm", []corev1.Node{node(ready, calm), node(ready, calm, disk)}, false},
		{"one pressed", []corev1.Node{node(ready, calm), node(ready, pressed)}, true},
	} {
		if got := memoryPressure(tt.nodes); got != tt.want {
			t.Errorf("%s: memoryPressure = %v, want %v", tt.name, got, tt.want)
		}
	}
}
