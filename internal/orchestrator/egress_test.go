package orchestrator

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// withNetworks offers every network policy.
func withNetworks(o *Options) {
	o.Networks = map[string]string{task.NetworkNone: "", task.NetworkAllowlist: "", task.NetworkOpen: ""}
}

// onRemoteRuntime offers every network policy, allowlist by default, and
// the kubernetes runtime, whose workers reach the egress proxies when
// egress is true (kubernetes.egress_listen is set).
func onRemoteRuntime(egress bool) func(*Options) {
	return func(o *Options) {
		withNetworks(o)
		o.Defaults.Network = task.NetworkAllowlist
		o.Runtimes["kubernetes"] = ""
		o.Images.Default = "busybox"
		if !egress {
			o.NoEgress = map[string]string{"kubernetes": "kubernetes.egress_listen is not set"}
		}
	}
}

// Every network policy the server offers is taken and recorded (what a
// sandbox with one gets is taskrun's TestPrepareWithEgress).
func TestSpawnNetworks(t *testing.T) {
	f := MustNew(t, withNetworks)
	for _, network := range []string{task.NetworkNone, task.NetworkAllowlist, task.NetworkOpen} {
		tk := f.MustSpawn(t, service.SpawnRequest{TaskDescription: "x", Command: []string{"true"}, Network: network})
		if tk.Network != network {
			t.Errorf("spawned with network %s: the task has %q", network, tk.Network)
		}
	}
}

// A task on a remote runtime whose workers reach the egress proxies gets
// the server's default network. (How its sandbox reaches its proxy is
// taskrun's TestPrepareRemoteEgress.)
func TestSpawnRemoteEgress(t *testing.T) {
	f := MustNew(t, onRemoteRuntime(true))
	tk := f.MustSpawn(t, service.SpawnRequest{TaskDescription: "x", Command: []string{"true"}, Runtime: "kubernetes"})
	if tk.Network != task.NetworkAllowlist {
		t.Errorf("default network on kubernetes with egress: %q, want the server's default allowlist", tk.Network)
	}
}

// Without an egress address, tasks on a remote runtime run with network
// none: by default, and a request for more is refused with the reason. (A
// task that asked for more under another configuration does not start:
// taskrun's TestPrepareRemoteWithoutEgress.)
func TestRemoteRuntimeWithoutEgress(t *testing.T) {
	f := MustNew(t, onRemoteRuntime(false))
	tk := f.MustSpawn(t, service.SpawnRequest{TaskDescription: "x", Command: []string{"true"}, Runtime: "kubernetes"})
	if tk.Network != task.NetworkNone {
		t.Errorf("default network: %q, want none", tk.Network)
	}
	_, _, err := f.o.Spawn(context.Background(), service.SpawnRequest{TaskDescription: "x", Command: []string{"true"}, Runtime: "kubernetes", Network: task.NetworkAllowlist})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "kubernetes.egress_listen is not set") {
		t.Errorf("allowlist on kubernetes without egress: %v", err)
	}
}
