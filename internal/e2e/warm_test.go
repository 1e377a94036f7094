//go:build integration

package e2e_test

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
	"github.com/corral-dev/corral/internal/workerproto"
)

// warmPools reads the local runtime's pools from /metrics: for each shape,
// the metric's value, for the metrics named.
func warmPools(t *testing.T, s *server, metric string) map[string]uint64 {
	t.Helper()
	return warmPoolsOf(t, s, "local", metric)
}

// warmPoolsOf is warmPools of runtime's pools.
func warmPoolsOf(t *testing.T, s *server, runtime, metric string) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	sc := bufio.NewScanner(strings.NewReader(metricsBody(t, s)))
	prefix := metric + `{runtime="` + runtime + `",shape="`
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), prefix)
		if !ok {
			continue
		}
		shape, val, ok := strings.Cut(line, `"} `)
		if !ok {
			t.Fatalf("/metrics: bad line %q", sc.Text())
		}
		n, err := strconv.ParseUint(val, 10, 64)
		if err != nil {
			t.Fatalf("/metrics: bad value in %q", sc.Text())
		}
		out[shape] = n
	}
	return out
}

// waitWarm waits until every pool of the local runtime holds n sandboxes.
func waitWarm(t *testing.T, s *server, n uint64) {
	t.Helper()
	waitWarmOf(t, s, "local", n)
}

// waitWarmOf is waitWarm of runtime's pools.
func waitWarmOf(t *testing.T, s *server, runtime string, n uint64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d warm sandboxes of each shape", n), func() bool {
		p := warmPoolsOf(t, s, runtime, "corral_warm_sandboxes")
		return len(p) > 0 && !slices.ContainsFunc(slices.Collect(maps.Values(p)), func(v uint64) bool { return v != n })
	})
}

// processMentioning reports whether a process's command line holds s.
func processMentioning(s string) bool {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), s) {
			return true
		}
	}
	return false
}

// warmIDs are the local runtime's warm sandboxes not yet claimed, by
// their state directories.
func warmIDs(tb testing.TB, data string) []string {
	tb.Helper()
	ents, err := os.ReadDir(filepath.Join(data, "run", "local"))
	if err != nil {
		tb.Fatal(err)
	}
	var ids []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "warm-") {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

// seenScript is a task's command: it reports what its sandbox's /tmp held
// before it (a warm sandbox that served an earlier task would hold that
// task's mark) and its environment, then marks /tmp with its own id.
const seenScript = `ls -A /tmp > /task/output/seen.txt && env > /task/output/env.txt && touch "/tmp/mark-$CORRAL_TASK_ID" && echo ok`

// workerEnvs returns the environment of every running corral-worker
// whose command is `worker MODE` (warm: a warm sandbox's main process;
// session: a session's exec agent): the one it started with, which a
// warm sandbox's claim does not change.
func workerEnvs(t *testing.T, mode string) [][]string {
	t.Helper()
	want := workerproto.WorkerBinary + "\x00worker\x00" + mode + "\x00"
	var envs [][]string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || string(b) != want {
			continue
		}
		if b, err = os.ReadFile(filepath.Join("/proc", e.Name(), "environ")); err == nil {
			envs = append(envs, strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00"))
		}
	}
	return envs
}

// TestWarmSandboxes: with a pool of warm sandboxes, tasks of the pool's
// shapes start in them, with the whole lifecycle, and no sandbox ever
// serves two tasks: each claimed sandbox leaves the pool for good, and no
// task sees another's files in its sandbox; a task that finds the pool
// empty starts cold.
func TestWarmSandboxes(t *testing.T) {
	t.Parallel()
	s := MustStart(t, func(c *config.Config) { c.Local.WarmPool = 2; c.Local.WarmIdle = 0 })
	waitWarm(t, s, 2)
	ctx := context.Background()
	check := func(id string) {
		t.Helper()
		s.waitSuccess(t, id, 30*time.Second, "seen.txt")
		b, err := os.ReadFile(filepath.Join(s.data, "tasks", id, "output", "seen.txt"))
		if err != nil {
			t.Fatal(err)
		}
		if seen := strings.TrimSpace(string(b)); seen != "" {
			t.Errorf("task %s found another task's files in its sandbox's /tmp: %q", id, seen)
		}
		// The warm sandbox's own environment is not the task's.
		if b, err = os.ReadFile(filepath.Join(s.data, "tasks", id, "output", "env.txt")); err != nil {
			t.Fatal(err)
		}
		if strings.Contains("\n"+string(b), "\nGOMAXPROCS=") {
			t.Errorf("task %s's command has the warm sandbox's GOMAXPROCS: %q", id, b)
		}
	}

	// Idle warm workers run with the worker's Ps, whatever the host's CPUs.
	envs := workerEnvs(t, "warm")
	if len(envs) == 0 {
		t.Fatal("no warm sandbox's main process found")
	}
	for _, env := range envs {
		if !slices.Contains(env, "GOMAXPROCS="+strconv.Itoa(workerproto.WorkerProcs)) {
			t.Errorf("a warm sandbox's main process has environment %q: want GOMAXPROCS=%d", env, workerproto.WorkerProcs)
		}
	}

	// One at a time, each into a full pool: every task is a claim, and
	// the sandbox it claimed is never in the pool again.
	claimed := map[string]bool{}
	for i := range 4 {
		waitWarm(t, s, 2)
		before := warmIDs(t, s.data)
		tk := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "seen", Agent: "command", Network: task.NetworkNone,
			Command: []string{"sh", "-c", seenScript}})
		check(tk.ID)
		after := warmIDs(t, s.data)
		var gone []string
		for _, id := range before {
			if !slices.Contains(after, id) {
				gone = append(gone, id)
			}
		}
		if len(gone) != 1 {
			t.Fatalf("task %d: warm sandboxes %v before, %v after: want exactly one claimed", i, before, after)
		}
		for _, id := range after {
			if claimed[id] {
				t.Fatalf("warm sandbox %s is in the pool again after serving a task", id)
			}
		}
		claimed[gone[0]] = true
		types := s.eventTypes(t, task.StreamID(tk.ID))
		want := []string{task.EventCreated, task.EventQueued, task.EventStarting, task.EventStarted, task.EventCompleted}
		var lifecycle []string
		for _, typ := range types {
			if slices.Contains(want, typ) {
				lifecycle = append(lifecycle, typ)
			}
		}
		if !slices.Equal(lifecycle, want) {
			t.Errorf("task %s events %v: want %v, each once, in order", tk.ID, types, want)
		}
	}
	if c := warmPools(t, s, "corral_warm_claims_total")["none"]; c != 4 {
		t.Errorf("claims of shape none: %d, want 4", c)
	}

	// Eight at once against a pool of two: some claim, the rest start
	// cold, every one succeeds alone in its sandbox.
	claims0, misses0 := warmPools(t, s, "corral_warm_claims_total")["none"], warmPools(t, s, "corral_warm_misses_total")["none"]
	var wg sync.WaitGroup
	ids := make([]string, 8)
	for i := range ids {
		wg.Go(func() {
			tk, _, err := s.client.Spawn(ctx, service.SpawnRequest{TaskDescription: "seen", Agent: "command", Network: task.NetworkNone,
				Command: []string{"sh", "-c", seenScript}})
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = tk.ID
		})
	}
	wg.Wait()
	for _, id := range ids {
		if id != "" {
			check(id)
		}
	}
	claims := warmPools(t, s, "corral_warm_claims_total")["none"] - claims0
	misses := warmPools(t, s, "corral_warm_misses_total")["none"] - misses0
	if claims < 2 || claims+misses != 8 {
		t.Errorf("8 tasks at once: %d claims and %d misses; want at least the 2 ready claimed, 8 in all", claims, misses)
	}

	// The default network's shape: the task's egress proxy socket is in
	// its warm sandbox where a cold one has it.
	tk := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "egress", Agent: "command",
		Command: []string{"sh", "-c", "test -S " + workerproto.EgressDir + "/" + workerproto.EgressSocket + " && " + seenScript}})
	check(tk.ID)
	if c := warmPools(t, s, "corral_warm_claims_total")["egress"]; c != 1 {
		t.Errorf("claims of shape egress: %d, want 1", c)
	}
}

// TestWarmSandboxesRebuiltAfterRestart: a server killed with warm
// sandboxes leaves none running, and the next server destroys what is
// left of them and starts its own, never reattaching to the old.
func TestWarmSandboxesRebuiltAfterRestart(t *testing.T) {
	testenv.RequireBwrap(t)
	t.Parallel()
	data := testenv.TempDir(t)
	cfgFile := filepath.Join(t.TempDir(), "corral.yaml")
	if err := os.WriteFile(cfgFile, []byte("local:\n  warm_pool: 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := startProcess(t, data, "--config", cfgFile)
	var old []string
	waitFor(t, "the first server's warm sandboxes", func() bool { old = warmIDs(t, data); return len(old) == 4 })
	srv.kill()
	// Their main processes see the server's end of the pipe close, and
	// the sandboxes end.
	for _, id := range old {
		waitFor(t, "the end of warm sandbox "+id, func() bool { return !processMentioning(id) })
	}

	srv = startProcess(t, data, "--config", cfgFile)
	var fresh []string
	waitFor(t, "the new server's warm sandboxes", func() bool { fresh = warmIDs(t, data); return len(fresh) == 4 })
	for _, id := range old {
		if slices.Contains(fresh, id) {
			t.Errorf("warm sandbox %s of the killed server is still there", id)
		}
		if _, err := os.Stat(filepath.Join(data, "run", "local", "_warm", id)); err == nil {
			t.Errorf("the slots of warm sandbox %s of the killed server are still there", id)
		}
	}
	tk := mustSpawn(t, srv.client, service.SpawnRequest{TaskDescription: "seen", Agent: "command", Network: task.NetworkNone,
		Command: []string{"sh", "-c", seenScript}})
	res, err := srv.client.Result(context.Background(), service.ResultRequest{TaskID: tk.ID, Wait: 30 * time.Second})
	if err != nil || res.Status != task.Success {
		t.Fatalf("task after the restart: %v %+v", err, res)
	}
	if after := warmIDs(t, data); slices.Equal(after, fresh) {
		t.Errorf("the task claimed none of the new server's warm sandboxes %v", fresh)
	}
}
