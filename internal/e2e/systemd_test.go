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

// unitMounts does to a mount namespace of its own what the unit's
// ProtectSystem=strict, ReadWritePaths= (StateDirectory=: the data root,
// $1), PrivateTmp=yes, ProtectHome=yes and ProtectKernelLogs=yes do, then
// runs the rest of its arguments.
const unitMounts = `set -eu
data=$1; shift
# ProtectSystem=strict: every mount read-only but /dev, /proc and /sys.
for mp in $(awk '{print $5}' /proc/self/mountinfo | sort -u); do
  case "$mp" in /dev | /dev/* | /proc | /proc/* | /sys | /sys/*) continue ;; esac
  mount -o remount,bind,ro "$mp"
done
# ReadWritePaths=, StateDirectory=: the data root.
mount --bind "$data" "$data"
mount -o remount,bind,rw "$data"
# PrivateTmp=yes.
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=1777 tmpfs /var/tmp
# ProtectHome=yes.
for d in /home /root /run/user; do
  if [ -d "$d" ]; then mount -t tmpfs -o ro,mode=000 tmpfs "$d"; fi
done
# ProtectKernelLogs=yes.
mount --bind /dev/null /proc/kmsg
exec "$@"
`

// TestSystemdUnitSandboxes runs `corral serve` as the unit would, as far
// as this machine can without systemd as PID 1 (systemd-run cannot start
// the unit): the unit's CapabilityBoundingSet= and NoNewPrivileges=
// through setpriv, its UMask=, and its file system settings in a mount
// namespace of its own (unitMounts), the data root and the binaries
// outside /tmp as the unit's are. A task runs and ends with its output in
// each host runtime, bubblewrap and gVisor, with the network as allowlist
// (its egress proxy) and none.
func TestSystemdUnitSandboxes(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.RequireBwrap(t)
	testenv.RequireRunsc(t)
	setpriv := testenv.RequireBinary(t, "setpriv", "apt-get install util-linux")
	unshare := testenv.RequireBinary(t, "unshare", "apt-get install util-linux")
	unit, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	props := map[string]string{"UMask": "0022"} // systemd's default
	for line := range strings.Lines(string(unit)) {
		key, value, ok := strings.Cut(strings.TrimSpace(line), "=")
		if ok && !strings.HasPrefix(key, "#") {
			props[key] = value
		}
	}
	// What unitMounts does, and setpriv below.
	for key, want := range map[string]string{"ProtectSystem": "strict", "PrivateTmp": "yes", "ProtectHome": "yes", "ProtectKernelLogs": "yes", "NoNewPrivileges": "yes", "StateDirectory": "corral"} {
		if props[key] != want {
			t.Fatalf("the unit's %s= is %q: the test does what %s=%s does, change it with the unit", key, props[key], key, want)
		}
	}
	caps := strings.Fields(props["CapabilityBoundingSet"])
	if len(caps) == 0 {
		t.Fatal("the unit has no CapabilityBoundingSet=")
	}
	bounding := "-all"
	for _, c := range caps {
		bounding += ",+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
	}

	// Outside /tmp, which PrivateTmp= hides, as /var/lib/corral and
	// /usr/local/bin are.
	if err := os.MkdirAll("/var/cache/corral-test", 0o755); err != nil {
		t.Fatal(err)
	}
	base, err := os.MkdirTemp("/var/cache/corral-test", "systemd-unit-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	data, bin := filepath.Join(base, "data"), filepath.Join(base, "bin")
	if err := os.Mkdir(data, 0o700); err != nil { // StateDirectoryMode=
		t.Fatal(err)
	}
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"corral", "corral-worker"} {
		mustCopy(t, filepath.Join(filepath.Dir(corralBin), name), filepath.Join(bin, name))
	}

	addr := freeLoopbackAddr(t)
	cmd := exec.Command(unshare, "--mount", "--propagation", "private", "--", "sh", "-c", unitMounts, "sh", data,
		"sh", "-c", `umask "$0" && exec "$@"`, props["UMask"],
		setpriv, "--no-new-privs", "--bounding-set="+bounding, "--inh-caps=-all", "--",
		filepath.Join(bin, "corral"), "serve", "--data", data, "--listen", addr)
	cmd.Dir = "/"
	cmd.Env = withoutCorralEnv()
	cmd.Stdout, cmd.Stderr = testWriter{t}, testWriter{t}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, client: httpapi.NewClient("http://"+addr, ""), url: "http://" + addr}
	t.Cleanup(func() {
		p.kill()
		killSandboxes(t, data)
		os.RemoveAll(base)
	})
	waitHealthy(t, p.url)

	ctx := context.Background()
	for _, rt := range []string{"local", "gvisor"} {
		for _, network := range []string{task.NetworkAllowlist, task.NetworkNone} {
			tk := mustSpawn(t, p.client, service.SpawnRequest{TaskDescription: rt + " as the unit runs it", Agent: "command", Runtime: rt, Network: network,
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
