//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/connlimit"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes/k8stest"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
	"github.com/corral-dev/corral/internal/workerproto"
)

// escapeRuntime is one way a task can be sandboxed: a runtime, and the
// configuration that picks its variant.
type escapeRuntime struct {
	name    string // the subtest's
	runtime string // the task's
	edit    func(testing.TB, *config.Config)
	require func(testing.TB)
	// accepted are the probe's checks that may succeed under this
	// runtime, each with the reason, which the documentation gives too.
	accepted map[string]string
	// warm: the runtime keeps sandboxes warm, and the probe's task must
	// claim one.
	warm bool
}

// config is what MustStart changes in the configuration for rt.
func (rt escapeRuntime) config(tb testing.TB) func(*config.Config) {
	return func(c *config.Config) {
		if rt.runtime != "local" {
			c.Local.WarmPool = 0 // no task runs there: nothing to keep warm
		}
		if rt.edit != nil {
			rt.edit(tb, c)
		}
	}
}

// escapeWarmPool is the warm variants' pool size per shape: one, as each
// subtest's server claims few; every warm sandbox more is one more started
// and destroyed for nothing by each of their servers (a gVisor pod, say).
const escapeWarmPool = 1

// escapeRuntimes are the runtimes the escape suite runs under. A runtime
// joins by adding itself here: every subtest then runs under it too.
var escapeRuntimes = []escapeRuntime{
	{name: "local", runtime: "local", require: func(tb testing.TB) { testenv.RequireBwrap(tb) },
		edit: func(_ testing.TB, c *config.Config) { c.Local.WarmPool = 0 }},
	// Tasks claim warm sandboxes, started before them (the probe checks
	// that it ran in one).
	{name: "local+warm", runtime: "local", require: func(tb testing.TB) { testenv.RequireBwrap(tb) },
		edit: func(_ testing.TB, c *config.Config) { c.Local.WarmPool = escapeWarmPool; c.Local.WarmIdle = 0 }, warm: true},
	{name: "gvisor", runtime: "gvisor", require: func(tb testing.TB) { testenv.RequireRunsc(tb) }},
	{name: "gvisor+warm", runtime: "gvisor", require: func(tb testing.TB) { testenv.RequireRunsc(tb) },
		edit: func(_ testing.TB, c *config.Config) {
			c.Gvisor.WarmPool = escapeWarmPool
			c.Gvisor.WarmIdle = 0
		}, warm: true},
	// A current runsc (2025), on the systrap platform the runtime picks
	// for it: Debian's runsc above has ptrace only.
	{name: "gvisor+systrap", runtime: "gvisor", require: func(tb testing.TB) { testenv.RequireSystrapRunsc(tb) },
		edit: func(tb testing.TB, c *config.Config) { c.Gvisor.Runsc = testenv.RequireSystrapRunsc(tb) }, accepted: gvisorClone3},
	{name: "docker", runtime: "docker", require: testenv.RequireDocker},
	{name: "docker+runsc", runtime: "docker", require: func(tb testing.TB) { testenv.RequireDockerRuntime(tb, "runsc") },
		edit: func(_ testing.TB, c *config.Config) { c.Docker.Runtime = "runsc" }},
	// Tasks claim warm containers, made before them.
	{name: "docker+warm", runtime: "docker", require: testenv.RequireDocker, warm: true,
		edit: func(_ testing.TB, c *config.Config) {
			c.Docker.WarmPool = escapeWarmPool
			c.Docker.WarmIdle = 0
		}},
	{name: "kubernetes", runtime: "kubernetes", require: requireKubernetes, edit: onKubernetes(""), accepted: runcPodLeaks},
	{name: "kubernetes+gvisor", runtime: "kubernetes", require: requireKubernetes, edit: onKubernetes(k8stest.GVisor), accepted: gvisorClone3},
	// Tasks claim warm pods, made before them.
	{name: "kubernetes+warm", runtime: "kubernetes", require: requireKubernetes, accepted: runcPodLeaks, warm: true,
		edit: func(tb testing.TB, c *config.Config) {
			onKubernetes("")(tb, c)
			c.Kubernetes.WarmPool = escapeWarmPool
			c.Kubernetes.WarmIdle = 0
		}},
	{name: "kubernetes+gvisor+warm", runtime: "kubernetes", require: requireKubernetes, warm: true, accepted: gvisorClone3,
		edit: func(tb testing.TB, c *config.Config) {
			onKubernetes(k8stest.GVisor)(tb, c)
			c.Kubernetes.WarmPool = escapeWarmPool
			c.Kubernetes.WarmIdle = 0
		}},
}

// runcPodLeaks are what a pod under runc reads that every other runtime
// masks: containerd's default masked paths leave them out, a pod spec has
// no maskedPaths, and runc refuses mounts over /proc files. Information,
// not a way out; package kubernetes and docs/security.md name them and
// recommend the gvisor RuntimeClass, under which the probe reads none.
var runcPodLeaks = map[string]string{
	"read /proc/kallsyms": "names of kernel symbols, every address zero for the pod's uid (kptr_restrict): " +
		`"kernel addresses in /proc/kallsyms" checks that`,
	"read /proc/config.gz": "the node kernel's build configuration",
	"read /proc/key-users": "how many kernel keys each uid of the node holds",
}

// gvisorClone3 are what a sandbox on a runsc with a clone3 of its own (the
// 2025 build of the systrap setups and the node's gVisor; Debian's runsc
// has none) does: runsc answers EPERM for every refusal of a seccomp
// profile, whatever errnoRet asks, and refusing clone3 with EPERM stops
// every C program's threads (C libraries fall back to clone only on
// ENOSYS), while clone3's flags are in memory, where no filter reads them.
// The namespaces are gVisor's kernel's, never the host's; package gvisor,
// package seccomp and docs/security.md say so.
var gvisorClone3 = map[string]string{
	"clone3 user namespace":              "a user namespace of gVisor's kernel",
	"clone3 user and network namespaces": "user and network namespaces of gVisor's kernel",
}

// gvisorKernel reports whether rt's processes run on gVisor's kernel.
func (rt escapeRuntime) gvisorKernel() bool {
	return rt.runtime == "gvisor" || rt.name == "docker+runsc" || rt.name == "kubernetes+gvisor" || rt.name == "kubernetes+gvisor+warm"
}

func requireKubernetes(tb testing.TB) { k8stest.Require(tb) }

// TestEscape runs the escape probe and the resource limit checks under
// every runtime in escapeRuntimes, through the whole server.
func TestEscape(t *testing.T) {
	probe := mustBuildProbe(t)
	for _, rt := range escapeRuntimes {
		t.Run(rt.name, func(t *testing.T) {
			t.Parallel()
			rt.require(t)
			t.Run("probe", func(t *testing.T) { t.Parallel(); testProbe(t, rt, probe) })
			t.Run("symlink out of output", func(t *testing.T) { t.Parallel(); testSymlinkOut(t, rt) })
			t.Run("host identity", func(t *testing.T) { t.Parallel(); testHostIdentity(t, rt) })
			t.Run("fifo swap", func(t *testing.T) { t.Parallel(); testFIFOSwap(t, rt) })
			if rt.runtime != "kubernetes" { // every pod runs as the runtime's one identity
				t.Run("own identities", func(t *testing.T) { t.Parallel(); testOwnIdentities(t, rt) })
			}
			if rt.runtime != "kubernetes" && !rt.warm { // no workspaces under roots there; no warm sandbox serves one
				t.Run("workspace hand-back", func(t *testing.T) { t.Parallel(); testHandBack(t, rt) })
				t.Run("workspace swap", func(t *testing.T) { t.Parallel(); testWorkspaceSwap(t, rt) })
			}
			if rt.runtime == "kubernetes" && !rt.warm { // sessions take no warm pod
				t.Run("session egress keys", func(t *testing.T) { t.Parallel(); testSessionEgressKeys(t, rt, probe) })
			}
			switch {
			case rt.runtime == "kubernetes":
				// The pod's memory limit is the container's, under
				// either RuntimeClass.
				t.Run("memory bomb", func(t *testing.T) { t.Parallel(); testMemoryBomb(t, rt) })
				t.Run("fork bomb", func(t *testing.T) {
					t.Skip("the kubernetes runtime sets no pids limit per pod: the node's podPidsLimit applies, which the test node leaves unlimited")
				})
			case rt.gvisorKernel():
				// gVisor's processes are not host processes, so the fork
				// bomb's host-side count does not apply; its pids and
				// memory limits are in the runtimes' conformance suites
				// (internal/sandbox/gvisor, internal/sandbox/docker).
			default:
				t.Run("fork bomb", func(t *testing.T) { t.Parallel(); testForkBomb(t, rt) })
				t.Run("memory bomb", func(t *testing.T) { t.Parallel(); testMemoryBomb(t, rt) })
			}
			// The timeout killing the whole process tree is
			// TestTimeoutKillsTheTree (default runtime).
		})
	}
}

// mustBuildStatic builds package pkg into path as a static binary, so it
// runs in any sandbox image.
func mustBuildStatic(t *testing.T, pkg, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "build", "-o", path, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
}

// mustBuildProbe builds the probe program into a temporary directory.
func mustBuildProbe(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "probe")
	mustBuildStatic(t, "github.com/corral-dev/corral/internal/sandbox/sandboxtest/probe", path)
	return path
}

// probeResult is one check of the probe's report.
type probeResult struct {
	OK      bool   `json:"ok"`
	Detail  string `json:"detail"`
	Control bool   `json:"control"`
}

func testProbe(t *testing.T, rt escapeRuntime, probe string) {
	// The checks that held are logged last, after the server's stop and
	// its checks (a cleanup registered first runs last): a failing test's
	// log cut short in its middle (CI keeps its head and tail) still
	// shows what failed.
	var held []string
	t.Cleanup(func() {
		for _, line := range held {
			t.Log(line)
		}
	})
	// A host with an egress credential rule, whose secret the probe tries
	// to learn through its proxy.
	up := newCredentialUpstream(t, probeUpstream)
	s := MustStart(t, func(c *config.Config) {
		rt.config(t)(c)
		up.configure(t, c, config.SchemeBearer, "", false)
	})
	caKey := filepath.Join(s.data, "run", "egress-ca", "ca.key")
	if _, err := os.Stat(caKey); err != nil {
		t.Fatalf("the egress CA's key is not where the probe looks: %v", err)
	}

	// The probe runs from the shared workspace, which the sandbox sees
	// read-only at /workspace/shared.
	b, err := os.ReadFile(probe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(s.data, "shared", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.data, "shared", "bin", "probe"), b, 0o755); err != nil {
		t.Fatal(err)
	}

	// Another task, whose directory the probe must not reach.
	victim := s.spawn(t, "the victim", "sh", "-c", "echo secret > output/secret.txt")
	s.waitSuccess(t, victim.ID, 60*time.Second)
	victimDir := filepath.Join(s.data, "tasks", victim.ID)

	// A service on the host's loopback, counting connections.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var accepted atomic.Int64
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()

	// A host process the probe must not see: its $0 is the marker.
	marker := "corral-escape-marker-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	marker = strings.ReplaceAll(marker, " ", "-")
	host := exec.Command("sh", "-c", "sleep 600; :", marker)
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { host.Process.Kill(); host.Wait() })
	if !markerVisible(marker) {
		t.Fatalf("the marker process is not visible on the host either")
	}

	// Under kubernetes, 127.0.0.1 is the pod's own loopback, and the test
	// machine reaches no 1.1.1.1, pod or not: what a pod reaches is the
	// node. This server runs on the node, not in the cluster, so the
	// suite's namespaces have no NetworkPolicy (the rendered one would
	// refuse it): a pod reaches every address of the node, and this
	// listener with it, an accepted result (docs/security.md), not a
	// closed sandbox. TestNetworkPoliciesHold shows the policies refuse it.
	var nodeTarget []string
	if rt.runtime == "kubernetes" {
		node := k8stest.NodeListener(t)
		nodeTarget = []string{"--connect", node}
		rt.accepted = maps.Clone(rt.accepted)
		if rt.accepted == nil {
			rt.accepted = map[string]string{}
		}
		rt.accepted["connect "+node] = "the suite's server runs on the node, so its namespaces have no NetworkPolicy: nothing keeps a pod from the node's addresses (TestNetworkPoliciesHold: the rendered policies do)"
	}

	argv := []string{"/workspace/shared/bin/probe", "--sandboxed",
		"--read", filepath.Join(s.data, "corral.db"),
		"--read", s.data,
		"--read", victimDir,
		"--read", filepath.Join(victimDir, "output", "secret.txt"),
		"--read", "/task/../tasks/" + victim.ID + "/output/secret.txt",
		"--write", filepath.Join(victimDir, "output", "x"),
		"--write", filepath.Join(s.data, "x"),
		"--write", "/task/../" + victim.ID + "-x",
		"--connect", ln.Addr().String(),
		"--connect", "1.1.1.1:443",
		"--host-marker=" + marker,
		"--read", caKey,
		"--credential-url", up.ruled(), "--unruled-url", up.unruled(),
	}
	argv = append(argv, nodeTarget...)
	var claims uint64
	claimed := func() uint64 {
		var n uint64
		for _, c := range warmPoolsOf(t, s, rt.runtime, "corral_warm_claims_total") {
			n += c
		}
		return n
	}
	if rt.warm {
		waitWarmOf(t, s, rt.runtime, escapeWarmPool)
		claims = claimed()
	}
	tk := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "try to get out", Agent: "command", Command: argv, Runtime: rt.runtime})
	s.waitSuccess(t, tk.ID, 90*time.Second)
	if rt.warm && claimed() != claims+1 {
		t.Fatalf("the probe's task did not claim a warm sandbox")
	}
	raw, err := os.ReadFile(filepath.Join(s.data, "tasks", tk.ID, "output", "probe.json"))
	if err != nil {
		t.Fatalf("the probe wrote no report: %v", err)
	}
	var report map[string]probeResult
	if err := json.Unmarshal(raw, &report); err != nil {
		t.Fatalf("decode report: %v\n%s", err, raw)
	}

	// Every check must be there: a probe that skipped one proves nothing.
	want := []string{
		"read " + filepath.Join(s.data, "corral.db"), "read " + s.data, "read " + victimDir, "read " + caKey,
		"write /workspace/shared/x", "write /usr/x", "write /etc/x", "write /x",
		"write " + filepath.Join(victimDir, "output", "x"),
		"connect " + ln.Addr().String(), "connect 1.1.1.1:443", "dns example.com",
		"raw socket AF_PACKET", "raw socket AF_INET", "bash /dev/tcp", "host processes", "capabilities",
		"uid 0", "ptrace traceme", "ptrace attach pid 1", "open /proc/1/mem", "open /proc/1/task/1/mem",
		"read the worker's environment", "open the worker's memory", "mount tmpfs",
		"read pid 1's environment", "read pid 1's thread's environment", "read every process's environment",
		"unshare user namespace", "unshare network namespace", "unshare user and network namespaces",
		"keyctl", "bpf", "io_uring_setup", "perf_event_open",
		"open /proc/sys/kernel/core_pattern for writing", "open any /proc/sys entry for writing",
		"list /etc/ssl/private", "read /proc/keys", "read /proc/timer_list", "read /proc/slabinfo",
		"read /proc/kcore", "read /proc/kallsyms", "kernel addresses in /proc/kallsyms",
		fmt.Sprintf("hold %d connections to the server", 4*connlimit.PerSandbox),
		fmt.Sprintf("hold %d connections dialled by a process that exited", 4*connlimit.PerSandbox),
		// Controls: these must hold for the rest to mean anything.
		"no_new_privs", "write /tmp/x", "connect own loopback listener", "read the worker's command line",
	}
	if tk.Network != task.NetworkNone {
		// Through its proxy: asks for a relay of the keys of an agent's
		// model API it has not.
		want = append(want, "relay to a model API the task has not", "plain request to a model API's relay",
			// And for the secret of a host's credential rule.
			"credential added on its rule's path", "credential on a path outside its rule", "credential through a dot segment",
			"credential through an encoded slash", "credential through a redirect to a host without a rule",
			"credential of another host's rule (Host header)")
	}
	for _, name := range want {
		if _, ok := report[name]; !ok {
			t.Errorf("report lacks check %q", name)
		}
	}
	// Failures first, then what held (logged last, see above), each in
	// name order.
	for _, name := range slices.Sorted(maps.Keys(report)) {
		r := report[name]
		switch why, accepted := rt.accepted[name]; {
		case r.Control && !r.OK:
			t.Errorf("control %q failed: %s", name, r.Detail)
		case !r.Control && r.OK && accepted:
			held = append(held, fmt.Sprintf("%-40s accepted under %s (%s): %s", name, rt.name, why, r.Detail))
		case !r.Control && r.OK:
			t.Errorf("ESCAPE %q: %s", name, r.Detail)
		case r.Control:
			held = append(held, fmt.Sprintf("%-40s control holds: %s", name, r.Detail))
		default:
			held = append(held, fmt.Sprintf("%-40s closed: %s", name, r.Detail))
		}
	}
	// gVisor checks files against their host owners, so its sandbox user
	// is its host identity inside too, one of its own above the reserved
	// uid; so is Docker's, which without user namespace remapping cannot
	// tell inside from outside. A pod runs as the kubernetes runtime's
	// identity, 1000, inside and on its node.
	d := report["uid 0"].Detail
	var uid, euid, gid int
	fmt.Sscanf(d, "uid %d euid %d gid %d", &uid, &euid, &gid)
	switch {
	case rt.runtime == "local" || rt.runtime == "kubernetes":
		if uid != 1000 || euid != 1000 {
			t.Errorf("probe ran as %q, want uid 1000 euid 1000", d)
		}
	case uid != euid || !hostuser.InRange(uid) || uid == hostuser.Reserved || gid != hostuser.Reserved:
		t.Errorf("probe ran as %q, want its own uid above %d and gid %d", d, hostuser.Reserved, hostuser.Reserved)
	}
	// The worker's checks tried the worker, not some other process: in a
	// warm sandbox it runs in the process that waited for the task, on
	// gVisor too (its environment never held the task's secrets, so it
	// does not execute itself again to hide them: worker.HideFromAgent).
	worker := " worker run-task "
	if rt.warm {
		worker = " worker warm"
	}
	if d := report["read the worker's command line"].Detail; !strings.Contains(d+" ", worker) {
		t.Errorf("the probe's parent is %q, want the worker (corral%s)", d, worker)
	}

	// And from outside: nothing reached the host.
	if n := accepted.Load(); n != 0 {
		t.Errorf("the host's loopback listener accepted %d connections", n)
	}
	for _, p := range []string{
		filepath.Join(victimDir, "output", "x"), filepath.Join(s.data, "x"),
		filepath.Join(s.data, "shared", "x"), filepath.Join(s.data, "tasks", victim.ID+"-x"),
	} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("the probe created %s on the host", p)
		}
	}
	if b, err := os.ReadFile("/usr/x"); err == nil && strings.Contains(string(b), "probe was here") {
		t.Errorf("the probe wrote the host's /usr/x")
	}
	assertSecretAbsent(t, s, tk.ID, up.secret)
}

// markerVisible reports whether a host process has an argv element equal
// to marker.
func markerVisible(marker string) bool {
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err == nil && slices.Contains(strings.Split(string(b), "\x00"), marker) {
				return true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// countProcesses counts host processes whose argv is exactly argv.
func countProcesses(argv ...string) int {
	want := strings.Join(argv, "\x00") + "\x00"
	n := 0
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && string(b) == want {
			n++
		}
	}
	return n
}

// testForkBomb: processes stop at the pids limit, and the server answers
// while the bomb runs.
func testForkBomb(t *testing.T, rt escapeRuntime) {
	s := MustStart(t, rt.config(t))
	ctx := context.Background()
	const pids = 40
	// The bombs of the runtimes run at once: each sleeps its own number of
	// seconds, so that each counts only its own sleeps.
	secs := strconv.Itoa(2000 + slices.IndexFunc(escapeRuntimes, func(r escapeRuntime) bool { return r.name == rt.name }))
	tk := mustSpawn(t, s.client, service.SpawnRequest{
		TaskDescription: "fork bomb", Agent: "command", Runtime: rt.runtime, TimeoutMinutes: new(5),
		// bash, unlike dash, survives a failed fork and keeps trying.
		Command:   []string{"bash", "-c", "while :; do sleep " + secs + " & done"},
		Resources: &service.ResourceRequest{PidsLimit: pids, CPULimit: "500m"},
	})
	s.waitStatus(t, tk.ID, task.Running, 20*time.Second)
	t.Cleanup(func() {
		s.client.Cancel(context.Background(), tk.ID)
		waitGone(t, "sleep", secs)
	})
	// For 5 s after the first sleep shows, the count never passes the
	// limit (the worker, bash and bwrap's reaper count too) and the
	// server answers every health check within 2 s.
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(30 * time.Second)
	for countProcesses("sleep", secs) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the bomb never started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	most, checks := 0, 0
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); checks++ {
		start := time.Now()
		resp, err := client.Get(s.url + "/healthz")
		if err != nil {
			t.Fatalf("healthz during the fork bomb: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("healthz during the fork bomb: %d after %s", resp.StatusCode, time.Since(start))
		}
		n := countProcesses("sleep", secs)
		if n > pids {
			t.Fatalf("%d sleeps run, over the pids limit of %d", n, pids)
		}
		most = max(most, n)
		time.Sleep(50 * time.Millisecond)
	}
	if most < pids/4 {
		t.Errorf("at most %d sleeps ran; the bomb did not reach the limit of %d", most, pids)
	}
	if st, err := s.client.Get(ctx, tk.ID); err != nil || st.Status != task.Running {
		t.Errorf("the bombing task is %v (%v), want still running until cancelled", st.Status, err)
	}
	t.Logf("fork bomb held at %d sleeps (pids limit %d) over %d health checks", most, pids, checks)
}

// testMemoryBomb: a process past the memory limit is killed and the task
// fails saying so.
func testMemoryBomb(t *testing.T, rt escapeRuntime) {
	s := MustStart(t, rt.config(t))
	tk := mustSpawn(t, s.client, service.SpawnRequest{
		TaskDescription: "memory bomb", Agent: "command", Runtime: rt.runtime, TimeoutMinutes: new(2),
		// awk doubles a string to 400 MB: a few allocations, where the
		// shell's 400 MB read from a pipe, before, took 70 s to 100 s of
		// gVisor's system calls on a busy node.
		Command:   []string{"awk", `BEGIN { s = "a"; while (length(s) < 400000000) s = s s; print "survived", length(s) > "output/survived.txt" }`},
		Resources: &service.ResourceRequest{MemoryLimit: "64Mi"},
	})
	res := s.wait(t, tk.ID, 100*time.Second)
	if res.Status != task.Failed {
		t.Fatalf("status %s, want failed", res.Status)
	}
	if !strings.Contains(res.ErrorMessage, "memory") {
		t.Errorf("error_message %q does not mention memory", res.ErrorMessage)
	}
	if _, err := os.Stat(filepath.Join(s.data, "tasks", tk.ID, "output", "survived.txt")); err == nil {
		t.Errorf("the memory bomb ran to the end")
	}
	// In a container (docker, a pod) the worker reads its own memory
	// cgroup's OOM kills and says so itself: the engine's OOM event,
	// which the server's message above may come from, is lost when
	// containerd's shim reads the kernel's notice after the container's
	// cgroup is gone (docker+warm, a busy CI run).
	if (rt.runtime == "docker" || rt.runtime == "kubernetes") && !rt.gvisorKernel() {
		dir, err := os.OpenRoot(filepath.Join(s.data, "tasks", tk.ID))
		if err != nil {
			t.Fatal(err)
		}
		defer dir.Close()
		st, err := workerproto.ReadStatus(dir, 1<<20)
		if err != nil || !strings.Contains(st.ErrorMessage, "out of memory") {
			t.Errorf("the worker's status.json says %q (%v), want its memory cgroup's OOM kill", st.ErrorMessage, err)
		}
	}
}

// testSymlinkOut: a symlink in output/ pointing outside is neither listed
// nor served.
func testSymlinkOut(t *testing.T, rt escapeRuntime) {
	s := MustStart(t, rt.config(t))
	tk := mustSpawn(t, s.client, service.SpawnRequest{
		TaskDescription: "symlinks out", Agent: "command", Runtime: rt.runtime,
		Command: []string{"sh", "-c", "ln -s /etc/passwd output/link && ln -s ../../../corral.db output/db && echo hi > output/real.txt"},
	})
	res := s.waitSuccess(t, tk.ID, 60*time.Second)
	var names []string
	for _, f := range res.OutputFiles {
		names = append(names, f.Name)
	}
	if !slices.Contains(names, "real.txt") || slices.Contains(names, "link") || slices.Contains(names, "db") {
		t.Errorf("output_files = %v, want real.txt and no symlinks", names)
	}
	// With the server's token: one listening for pods (kubernetes) is not
	// on loopback and asks for it.
	get := func(name string) (int, string) {
		req, err := http.NewRequest("GET", s.url+"/api/tasks/"+tk.ID+"/files/"+name, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+s.app.Token())
		return send(t, req)
	}
	for _, name := range []string{"link", "db"} {
		code, body := get(name)
		if code == 200 || code >= 500 || strings.Contains(body, "root:") || strings.Contains(body, "SQLite") {
			t.Errorf("GET files/%s = %d %q, want refused", name, code, body)
		}
	}
	if code, body := get("real.txt"); code != 200 || body != "hi\n" {
		t.Errorf("GET files/real.txt = %d %q", code, body)
	}
}

// testHostIdentity: a sandbox's processes run on the host as the reserved
// identity (a pod's as the kubernetes runtime's identity, its pause process
// as another), never root; and what a worker leaves (a set-uid copy of id,
// a world-writable directory, a FIFO) carries nothing the host honours
// once the task ends, in a data root no other host user can enter.
func testHostIdentity(t *testing.T, rt escapeRuntime) {
	testenv.RequireRoot(t)
	s := MustStart(t, rt.config(t))
	marker := "corral-identity-" + strings.ReplaceAll(rt.name, "+", "-")
	// The worker makes its files, then waits until the test has looked
	// at its processes (it removes output/go). The test waits for
	// output/ready, made after output/go: under gVisor a create is the
	// gofer's create on the host and then more steps in the sandbox, and
	// removing the file between them fails the create with ENOENT.
	script := `cp /bin/id output/suid-id && chmod 6755 output/suid-id && mkdir output/open && chmod 1777 output/open &&
mkfifo output/fifo && : > output/go && : > output/ready && while [ -e output/go ]; do sleep 0.05; done; sh -c 'exit 0' ` + marker
	tk := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "leave hostile files", Agent: "command", Runtime: rt.runtime,
		Command: []string{"sh", "-c", script}})
	out := filepath.Join(s.data, "tasks", tk.ID, "output")
	waitFor(t, "the worker making its files", func() bool {
		_, err := os.Stat(filepath.Join(out, "ready"))
		return err == nil
	})
	// While it runs: every file it made is the sandbox's own identity's
	// on the host, one of the range above the reserved one with the
	// sandboxes' group (a pod's: the kubernetes runtime's identity, 1000,
	// on every node), and under local so is every process of the sandbox
	// (gVisor's processes are its own kernel's, not the host's).
	fi, err := os.Lstat(filepath.Join(out, "suid-id"))
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	want := st.Uid
	switch {
	case rt.runtime == "kubernetes" && (st.Uid != 1000 || st.Gid != 1000):
		t.Errorf("a worker's file is owned by %d:%d on the node, want 1000:1000", st.Uid, st.Gid)
	case rt.runtime != "kubernetes" && (!hostuser.InRange(int(st.Uid)) || st.Uid == hostuser.Reserved || st.Gid != hostuser.Reserved):
		t.Errorf("a worker's file is owned by %d:%d on the host, want a uid of its own above %d, gid %d", st.Uid, st.Gid, hostuser.Reserved, hostuser.Reserved)
	}
	if rt.runtime == "kubernetes" && !rt.gvisorKernel() {
		// A runc pod's processes are the node's: the worker's as 1000,
		// the pod's pid 1, its pause process, as kubernetes.PauseUser
		// (so that the worker cannot reach it), none as root.
		uids := podUIDs(t, tk.ID)
		if uids[1] != kubernetes.PauseUser.UID {
			t.Errorf("the pod's pid 1 runs as host uid %d, want %d (of %v, by pid in the pod)", uids[1], kubernetes.PauseUser.UID, uids)
		}
		if len(uids) < 2 {
			t.Errorf("found %v in the pod's pid namespace, want pause and the worker", uids)
		}
		for pid, uid := range uids {
			if pid != 1 && uid != int(want) {
				t.Errorf("the pod's process %d runs as host uid %d, want %d", pid, uid, want)
			}
		}
		t.Logf("host uids of the pod's processes, by pid in the pod: %v", uids)
	}
	if rt.name == "local" {
		uids := sandboxUIDs(t, tk.ID)
		if len(uids) == 0 {
			t.Errorf("found no process of the sandbox on the host")
		}
		for pid, uid := range uids {
			if uid != int(want) {
				t.Errorf("sandbox process %d runs as host uid %d, want its own %d", pid, uid, want)
			}
		}
	}
	os.Remove(filepath.Join(out, "go"))
	s.waitSuccess(t, tk.ID, 60*time.Second)
	// Once it ended: owned by the server, no set-id, sticky or
	// group/other write bits, no FIFO; and the data root is closed. The
	// walk takes a directory's mode on the way down and its owner on the
	// way up, and the top goes back last: once the task directory is
	// root's again, every entry beneath has been taken back.
	rootOwned := func(p string) bool {
		fi, err := os.Lstat(p)
		return err == nil && fi.Sys().(*syscall.Stat_t).Uid == 0
	}
	waitFor(t, "the task directory taken back", func() bool {
		return rootOwned(filepath.Dir(out)) && rootOwned(filepath.Join(out, "suid-id"))
	})
	for _, name := range []string{"suid-id", "open"} {
		fi, err := os.Lstat(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != 0 || st.Gid != 0 || fi.Mode()&(os.ModeSetuid|os.ModeSetgid|os.ModeSticky|0o022) != 0 {
			t.Errorf("%s: %v owned by %d:%d after the task, want no set-id, sticky or group/other write bits, owned by root", name, fi.Mode(), st.Uid, st.Gid)
		}
	}
	if _, err := os.Lstat(filepath.Join(out, "fifo")); err == nil {
		t.Errorf("the worker's FIFO is still in its output")
	}
	fi, err = os.Stat(s.data)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o710 || st.Gid != hostuser.Reserved {
		t.Errorf("data root is %v group %d, want 0710 and the sandbox group", fi.Mode().Perm(), st.Gid)
	}
	// Another host user cannot even reach the worker's file.
	cmd := exec.Command(filepath.Join(out, "suid-id"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}}
	if b, err := cmd.CombinedOutput(); !errors.Is(err, fs.ErrPermission) {
		t.Errorf("nobody ran the worker's set-uid file: %v %s, want permission denied", err, b)
	}
}

// podUIDs returns the host uid of every process in the pid namespace of
// task id's sandbox (a pod's, pause included), by its pid there.
func podUIDs(t *testing.T, id string) map[int]int {
	t.Helper()
	// Any process of the task will do, but not just the first: one of
	// them may be a short-lived child (the worker's sleep) that has
	// already exited.
	var ns string
	for pid := range sandboxUIDs(t, id) {
		if n, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "ns", "pid")); err == nil {
			ns = n
			break
		}
	}
	out := map[int]int{}
	if ns == "" {
		return out
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if n, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", "pid")); err != nil || n != ns {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		uid, nspid := -1, -1
		for _, line := range strings.Split(string(b), "\n") {
			switch f := strings.Fields(line); {
			case len(f) >= 2 && f[0] == "Uid:":
				uid, _ = strconv.Atoi(f[1])
			case len(f) >= 2 && f[0] == "NSpid:":
				nspid, _ = strconv.Atoi(f[len(f)-1]) // the innermost
			}
		}
		out[nspid] = uid
	}
	return out
}

// sandboxUIDs returns the host uid of every process of task id's sandbox:
// those in another pid namespace than the test's whose argv or
// environment names the task (the worker and its children).
func sandboxUIDs(t *testing.T, id string) map[int]int {
	t.Helper()
	out := map[int]int{}
	self, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ns, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", "pid")); err != nil || ns == self {
			continue
		}
		env, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		argv, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if !strings.Contains(string(env)+string(argv), id) {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "Uid:" {
				uid, _ := strconv.Atoi(f[1])
				out[pid] = uid
			}
		}
	}
	return out
}

// testSessionEgressKeys: the commands of a session on kubernetes with a
// network reach the server's egress listener, as their pod must; the
// probe, run as one, tries there to open another session's proxy and its
// own session's with every key it can find (none: the exec agent's key is
// out of its commands' reach, in its environment and memory as its token
// is).
func testSessionEgressKeys(t *testing.T, rt escapeRuntime, probe string) {
	listener := freeAddr(t, k8stest.NodeIP)
	s := MustStart(t, func(c *config.Config) {
		rt.config(t)(c)
		c.Kubernetes.EgressListen = listener
	})
	b, err := os.ReadFile(probe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(s.data, "shared", "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.data, "shared", "bin", "probe"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var ids []string
	for range 2 {
		created, err := s.client.CreateSession(ctx, service.CreateSessionRequest{Runtime: rt.runtime, Network: task.NetworkAllowlist})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, created.SessionID)
	}
	victim, own := ids[0], ids[1]
	checks := []string{"egress listener", "read the worker's", "open the worker's memory", "read pid 1's", "read every process's environment"}
	argv := []string{"exec", "/workspace/shared/bin/probe", "--sandboxed", "--out=", "--egress-listener", listener, "--egress-as", victim, "--egress-as", own}
	for _, c := range checks {
		argv = append(argv, "--only", strconv.Quote(c))
	}
	var out strings.Builder
	end, err := s.client.ExecSession(ctx, own, httpapi.ExecBody{Command: shell(strings.Join(argv, " "))}, func(ch httpapi.ExecChunk) error {
		if ch.Type == "stdout" {
			out.Write(ch.Bytes())
		}
		return nil
	})
	if err != nil || end.ExitCode != 0 {
		t.Fatalf("the probe in a session: %+v, %v", end, err)
	}
	var report map[string]probeResult
	if err := json.Unmarshal([]byte(out.String()), &report); err != nil {
		t.Fatalf("decode report: %v\n%s", err, out.String())
	}
	want := []string{"egress listener greets", "egress listener as " + victim, "egress listener as " + own,
		"read the worker's command line", "read the worker's environment", "open the worker's memory",
		"read pid 1's environment", "read every process's environment"}
	for _, name := range want {
		r, ok := report[name]
		switch {
		case !ok:
			t.Errorf("report lacks check %q", name)
		case r.Control && !r.OK:
			t.Errorf("control %q failed: %s", name, r.Detail)
		case !r.Control && r.OK:
			t.Errorf("ESCAPE %q: %s", name, r.Detail)
		default:
			t.Logf("%-40s %s", name, r.Detail)
		}
	}
	if d := report["read the worker's command line"].Detail; !strings.Contains(d+" ", " worker session ") {
		t.Errorf("the probe's parent is %q, want the session's exec agent (corral-worker worker session)", d)
	}
}
