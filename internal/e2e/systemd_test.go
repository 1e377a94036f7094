//go:build integration

package e2e_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// unitFile is the systemd unit the releases ship.
const unitFile = "../../deploy/systemd/corral.service"

// TestSystemdUnitVerifies: systemd-analyze verify finds nothing to say of
// the unit (an unknown key, a bad value and a missing ExecStart binary
// each make it speak), in a root of its own that holds the host's system
// units and a corral binary where the unit runs it.
func TestSystemdUnitVerifies(t *testing.T) {
	analyze := testenv.RequireBinary(t, "systemd-analyze", "apt-get install systemd")
	root := t.TempDir()
	for _, dir := range []string{"usr/local/bin", "etc/systemd/system", "usr/lib/systemd"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mustCopy(t, corralBin, filepath.Join(root, "usr/local/bin/corral"))
	// The units the unit names (network-online.target, multi-user.target).
	if out, err := exec.Command("cp", "-r", "/lib/systemd/system", filepath.Join(root, "usr/lib/systemd/")).CombinedOutput(); err != nil {
		t.Fatalf("copy the system units: %v: %s", err, out)
	}
	unit, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/systemd/system/corral.service"), unit, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", "--root="+root, "corral.service").CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// TestSystemdUnitSandboxes runs `corral serve` with the unit's
// CapabilityBoundingSet=, NoNewPrivileges= and UMask= (setpriv and sh:
// systemd is not PID 1 here, so systemd-run cannot start the unit): a task runs
// and ends with its output in each host runtime, bubblewrap and gVisor,
// with the network as allowlist (its egress proxy) and none.
func TestSystemdUnitSandboxes(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireBwrap(t)
	testenv.RequireRunsc(t)
	setpriv := testenv.RequireBinary(t, "setpriv", "apt-get install util-linux")
	unit, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	var caps []string
	nnp, umask := false, "0022" // systemd's default
	for line := range strings.Lines(string(unit)) {
		key, value, _ := strings.Cut(strings.TrimSpace(line), "=")
		switch key {
		case "CapabilityBoundingSet":
			caps = strings.Fields(value)
		case "NoNewPrivileges":
			nnp = value == "yes"
		case "UMask":
			umask = value
		}
	}
	if len(caps) == 0 || !nnp {
		t.Fatalf("the unit has no CapabilityBoundingSet= (%q) or no NoNewPrivileges=yes (%v)", caps, nnp)
	}
	bounding := "-all"
	for _, c := range caps {
		bounding += ",+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
	}

	data := testenv.TempDir(t)
	addr := freeLoopbackAddr(t)
	cmd := serveCommand(t, data, addr)
	cmd.Args = append([]string{"sh", "-c", `umask "$0" && exec "$@"`, umask, setpriv, "--no-new-privs", "--bounding-set=" + bounding, "--inh-caps=-all", "--"}, cmd.Args...)
	cmd.Path = "/bin/sh"
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, client: httpapi.NewClient("http://"+addr, ""), url: "http://" + addr}
	t.Cleanup(func() {
		p.kill()
		killSandboxes(t, data)
	})
	waitHealthy(t, p.url)

	ctx := context.Background()
	for _, rt := range []string{"local", "gvisor"} {
		for _, network := range []string{task.NetworkAllowlist, task.NetworkNone} {
			tk := mustSpawn(t, p.client, service.SpawnRequest{TaskDescription: rt + " under the unit's privileges", Agent: "command", Runtime: rt, Network: network,
				Command: []string{"sh", "-c", "id -u > output/result.txt"}})
			res, err := p.client.Result(ctx, service.ResultRequest{TaskID: tk.ID, Wait: time.Minute, IncludeFileContents: []string{"result.txt"}})
			if err != nil {
				t.Fatal(err)
			}
			if got := res.FileContents["result.txt"].Content; res.Status != task.Success || got == "" || got == "0\n" {
				t.Errorf("%s, network %s: %s %q (%s), want success as the sandbox's user", rt, network, res.Status, got, res.ErrorMessage)
			}
		}
	}
}
