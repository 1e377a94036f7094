package placement

import (
	"reflect"
	"testing"

	"github.com/corral-dev/corral/internal/rtkind"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/workerproto"
)

// fakeRuntime is a sandbox.Runtime that makes nothing.
type fakeRuntime struct{ sandbox.Runtime }

func TestSet(t *testing.T) {
	local, _ := rtkind.Of("local")
	docker, _ := rtkind.Of("docker")
	k8s, _ := rtkind.Of("kubernetes")
	rt := fakeRuntime{}
	s := NewSet(
		&Runtime{Kind: local, Sandbox: rt},
		&Runtime{Kind: docker, Sandbox: rt, Unavailable: "no engine"},
		&Runtime{Kind: k8s, Sandbox: rt, ServerURL: "http://corral:7777", NoEgress: "no egress_listen"},
	)
	if s.Usable("local") == nil || s.Usable("docker") != nil || s.Usable("gvisor") != nil || s.Usable("podman") != nil {
		t.Errorf("Usable: local %v, docker %v, gvisor %v, podman %v; want only local", s.Usable("local"), s.Usable("docker"), s.Usable("gvisor"), s.Usable("podman"))
	}
	if g, ok := s.Get("gvisor"); !ok || g.Sandbox != nil || g.Unavailable == "" {
		t.Errorf("Get(gvisor) = %+v, %v; want a record of its kind alone, unavailable", g, ok)
	}
	if _, ok := s.Get("podman"); ok {
		t.Errorf("Get(podman): a runtime")
	}
	want := map[string]string{"local": "", "gvisor": "not configured", "docker": "no engine", "kubernetes": ""}
	if got := s.Unavailable(); !reflect.DeepEqual(got, want) {
		t.Errorf("Unavailable() = %v, want %v", got, want)
	}
	if got := s.NoEgress(); !reflect.DeepEqual(got, map[string]string{"kubernetes": "no egress_listen"}) {
		t.Errorf("NoEgress() = %v", got)
	}
	if got := len(s.Sandboxes()); got != 3 {
		t.Errorf("Sandboxes() has %d, want the 3 configured", got)
	}
	if k, _ := s.Get("kubernetes"); !k.Remote {
		t.Errorf("kubernetes is not remote")
	}
	var none *Set // a server whose start failed before it had one
	if got := none.Sandboxes(); len(got) != 0 {
		t.Errorf("nil Set's Sandboxes() = %v", got)
	}
	if r, ok := none.Get("docker"); !ok || r.Sandbox != nil || r.Unavailable == "" || !r.Images || none.Usable("local") != nil {
		t.Errorf("nil Set's Get(docker) = %+v, %v; want its kind, unconfigured, and nothing usable", r, ok)
	}
}

// Every sandbox mounts shared/ read-only and the two binaries; one on
// this host also the server's socket directory, one off it not.
func TestBaseMounts(t *testing.T) {
	b := Base{BinDir: "run/bin", SocketDir: "run/sock"}
	targets := func(ms []sandbox.Mount) map[string]bool {
		out := map[string]bool{}
		for _, m := range ms {
			if !m.ReadOnly {
				t.Errorf("%+v is writable", m)
			}
			out[m.Source+" "+m.Target] = true
		}
		return out
	}
	host, remote := targets(b.Mounts(false)), targets(b.Mounts(true))
	for _, want := range []string{"shared " + workerproto.SharedDir, "run/bin/corral " + workerproto.CorralBinary, "run/bin/corral-worker " + workerproto.WorkerBinary} {
		if !host[want] || !remote[want] {
			t.Errorf("%q missing: host %v, remote %v", want, host, remote)
		}
	}
	if !host["run/sock "+workerproto.SocketDir] || len(remote) != 3 {
		t.Errorf("socket directory: host %v, remote %v; want it on the host alone", host, remote)
	}
}
