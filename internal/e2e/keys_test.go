//go:build integration

package e2e_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/agent/agenttest"
	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestKeysNeverEnterTheSandbox: the real Claude Code runs a task whose API
// key the egress adds to its model requests. While the request carrying
// the key is in flight (the scripted model scans before it answers), no
// process of the task's sandbox holds the key in its environment, its
// command line or any readable page of its memory, as root reads them
// (more than the sandbox's own processes may read of each other); after
// the task, no file of its directory, no log and no event holds it. The
// scan is shown able to find a key where one is: a command task given one
// in its environment, in the same server, is found holding it.
func TestKeysNeverEnterTheSandbox(t *testing.T) {
	for _, rt := range []string{"local", "gvisor"} {
		t.Run(rt, func(t *testing.T) {
			if rt == "gvisor" {
				testenv.RequireRunsc(t)
			}
			t.Parallel()
			const control = "sk-control-key-5e1d0c3b"
			ids := make(chan string, 1)
			var (
				mu       sync.Mutex
				inFlight []string
				scanned  bool
			)
			s, ep := mustClaudeServerAllowing(t, agenttest.AnthropicOptions{Respond: func(agenttest.AnthropicRequest) agenttest.Reply {
				mu.Lock()
				defer mu.Unlock()
				if !scanned {
					id := <-ids
					inFlight, scanned = keyScan(t, id, claudeTestKey), true
				}
				return agenttest.Reply{Text: "Scanned."}
			}}, false, func(_ testing.TB, c *config.Config) {
				c.Runtime = rt
				c.Local.WarmPool = 0 // a sandbox named after its task: its cgroups are found by the name
				c.Agents.Command.Env = map[string]string{"CONTROL_KEY": control}
			})

			// The scan finds a key that is there.
			ctl := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "holds a key", Agent: "command", Command: []string{"sh", "-c", "sleep 5"}})
			(&proc{client: s.client}).waitRunning(t, ctl.ID, 30*time.Second)
			// Under gVisor a process's environment is the guest's, in the
			// sandbox's memory, not on the host.
			found := keyScan(t, ctl.ID, control)
			if !hasIn(found, "/mem") || rt == "local" && !hasIn(found, "/environ") {
				t.Errorf("the scan of a sandbox whose environment holds a key found it in %v; want a memory (and on local an environment)", found)
			}

			tk := spawnClaude(t, s, service.SpawnRequest{TaskDescription: "Say something", Runtime: rt})
			ids <- tk.ID
			res := s.wait(t, tk.ID, 3*time.Minute)
			if res.Status != task.Success {
				t.Fatalf("task %s: %q", res.Status, res.ErrorMessage)
			}
			mu.Lock()
			defer mu.Unlock()
			if !scanned {
				t.Fatal("the model was never asked: nothing was scanned")
			}
			if len(inFlight) > 0 {
				t.Errorf("while its request was in flight the key was in %v", inFlight)
			}
			for _, r := range ep.Requests() {
				if !r.KeyOK {
					t.Errorf("request %s reached the model without the key", r.Path)
				}
			}
			assertNoKey(t, s, tk.ID)
		})
	}
}

func hasIn(list []string, part string) bool {
	for _, s := range list {
		if strings.Contains(s, part) {
			return true
		}
	}
	return false
}

// keyScan looks for needle in every host process of sandbox id (those
// whose cgroup path names it: the local runtime's processes, gVisor's
// sentry and gofer): their environment, command line and readable memory.
// It returns where it found it, and fails t if no process is the
// sandbox's.
func keyScan(t *testing.T, id, needle string) []string {
	t.Helper()
	procs, _ := filepath.Glob("/proc/[0-9]*")
	var found []string
	seen := 0
	for _, p := range procs {
		cg, err := os.ReadFile(p + "/cgroup")
		if err != nil || !bytes.Contains(cg, []byte(id)) {
			continue
		}
		seen++
		for _, f := range []string{"environ", "cmdline"} {
			if b, _ := os.ReadFile(p + "/" + f); bytes.Contains(b, []byte(needle)) {
				found = append(found, p+"/"+f)
			}
		}
		if where := memContains(p, []byte(needle)); where != "" {
			found = append(found, p+"/mem"+where)
		}
	}
	if seen == 0 {
		t.Errorf("no process is in a cgroup of sandbox %s", id)
	}
	return found
}

// memContains reads every readable mapping of process dir (/proc/PID) and
// returns where it found needle ("" if nowhere): " at 0xADDR (path)".
func memContains(dir string, needle []byte) string {
	maps, err := os.Open(dir + "/maps")
	if err != nil {
		return ""
	}
	defer maps.Close()
	mem, err := os.Open(dir + "/mem")
	if err != nil {
		return ""
	}
	defer mem.Close()
	const chunk = 4 << 20
	buf := make([]byte, chunk+len(needle))
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[1][0] != 'r' {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if !ok || err1 != nil || err2 != nil {
			continue
		}
		name := ""
		if len(f) >= 6 {
			name = f[5]
		}
		for off := start; off < end; off += chunk {
			n := min(uint64(len(buf)), end-off)
			k, err := mem.ReadAt(buf[:n], int64(off))
			if i := bytes.Index(buf[:k], needle); i >= 0 {
				return fmt.Sprintf(" at %#x (%s)", off+uint64(i), name)
			}
			if err != nil && err != io.EOF {
				break // a page that cannot be read (a guard, I/O memory): the next mapping
			}
		}
	}
	return ""
}
