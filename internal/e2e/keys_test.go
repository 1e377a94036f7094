//go:build integration

package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/agent/agenttest"
	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/sandbox"
	"github.com/corral-dev/corral/internal/sandbox/kubernetes/k8stest"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestKeysNeverEnterTheSandbox: the real Claude Code (on docker, whose
// images lack it, a client of the Messages API in its place) runs a task
// whose API key the egress adds to its model requests. While the request carrying
// the key is in flight (the scripted model scans before it answers), no
// process of the task's sandbox holds the key in its environment, its
// command line or any readable page of its memory, as root reads them
// (more than the sandbox's own processes may read of each other); after
// the task, no file of its directory, no log and no event holds it. The
// scan is shown able to find a key where one is: a command task given one
// in its environment, in the same server, is found holding it.
func TestKeysNeverEnterTheSandbox(t *testing.T) {
	for _, rt := range []string{"local", "gvisor", "docker", "kubernetes"} {
		t.Run(rt, func(t *testing.T) {
			switch rt {
			case "gvisor":
				testenv.RequireRunsc(t)
			case "docker":
				testenv.RequireDocker(t)
			}
			t.Parallel()
			const control = "sk-control-key-5e1d0c3b"
			ids := make(chan string, 1)
			var (
				mu       sync.Mutex
				inFlight []string
				scanned  bool
				// sandboxOf names what of a task's sandbox its processes'
				// cgroup paths hold.
				sandboxOf = func(id string) string { return id }
			)
			s, ep := mustClaudeServerAllowing(t, agenttest.AnthropicOptions{Respond: func(agenttest.AnthropicRequest) agenttest.Reply {
				mu.Lock()
				defer mu.Unlock()
				if !scanned {
					id := <-ids
					inFlight, scanned = keyScan(t, sandboxOf(id), claudeTestKey), true
				}
				return agenttest.Reply{Text: "Scanned."}
			}}, false, func(tb testing.TB, c *config.Config) {
				c.Runtime = rt
				c.Local.WarmPool = 0 // a sandbox named after its task: its cgroups are found by the name
				c.Agents.Command.Env = map[string]string{"CONTROL_KEY": control}
				if rt == "docker" {
					// Claude Code is not in the engine's images: in its
					// place, a client of the Messages API as the CLI is,
					// through ANTHROPIC_BASE_URL with ANTHROPIC_API_KEY.
					c.AIWorker.AICoderImage = testenv.DockerPythonImage
					client := filepath.Join(c.Data, "shared", "messages-client")
					if err := os.MkdirAll(filepath.Dir(client), 0o755); err != nil {
						tb.Fatal(err)
					}
					if err := os.WriteFile(client, []byte("#!/usr/bin/python3\n"+messagesClient), 0o755); err != nil {
						tb.Fatal(err)
					}
					c.Agents.Claude.Binary = "/workspace/shared/messages-client"
					sandboxOf = func(id string) string { return dockerContainer(tb, id) }
				}
				if rt == "kubernetes" {
					sandboxOf = onClaudePods(tb, c)
				}
			})

			// The scan finds a key that is there.
			ctl := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "holds a key", Agent: "command", Command: []string{"sh", "-c", "touch output/up; sleep 10"}})
			waitFile(t, filepath.Join(s.data, "tasks", ctl.ID, "output", "up"))
			// Under gVisor a process's environment is the guest's, in the
			// sandbox's memory, not on the host.
			found := keyScan(t, sandboxOf(ctl.ID), control)
			if !hasIn(found, "/mem") || rt == "local" && !hasIn(found, "/environ") {
				t.Errorf("the scan of a sandbox whose environment holds a key found it in %v; want a memory (and on local an environment)", found)
			}

			tk := spawnClaude(t, s, service.SpawnRequest{TaskDescription: "Say something"})
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
			assertSecretAbsent(t, s, tk.ID, claudeTestKey)
		})
	}
}

// messagesClient asks the Messages API at $ANTHROPIC_BASE_URL once with
// $ANTHROPIC_API_KEY, as Claude Code does, and prints the result line its
// adapter reads (the CLI's flags are its arguments, unread).
const messagesClient = `
import json, os, urllib.request
req = urllib.request.Request(os.environ["ANTHROPIC_BASE_URL"] + "/v1/messages",
    data=json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}]}).encode(),
    headers={"x-api-key": os.environ["ANTHROPIC_API_KEY"], "anthropic-version": "2023-06-01", "content-type": "application/json"})
answer = json.load(urllib.request.urlopen(req))
print(json.dumps({"type": "result", "subtype": "success", "is_error": False, "result": answer["content"][0]["text"]}))
`

// dockerContainer is the id of task id's container on the test engine.
func dockerContainer(tb testing.TB, id string) string {
	tb.Helper()
	var cid string
	k8stest.WaitFor(tb, "the container of task "+id, func() bool {
		out, err := exec.Command("docker", "-H", "unix://"+testenv.DockerSocket, "ps", "-q", "--no-trunc", "--filter", "label="+sandbox.LabelTaskID+"="+id).Output()
		cid = strings.TrimSpace(string(out))
		return err == nil && cid != "" && !strings.Contains(cid, "\n")
	})
	return cid
}

// onClaudePods runs tasks in pods under gVisor from the image with Claude
// Code (and git), their egress over TCP to the server, and returns what of
// a task's sandbox its processes' cgroup paths hold (its pod's uid).
func onClaudePods(tb testing.TB, c *config.Config) (sandboxOf func(id string) string) {
	onKubernetes(k8stest.GVisor)(tb, c)
	k8stest.RequireImage(tb, k8stest.ClaudeImage)
	c.AIWorker.AICoderImage = k8stest.ClaudeImage
	c.Kubernetes.EgressListen = k8stest.NodeIP + ":0"
	cs, ns := k8stest.Clientset(tb, k8stest.Require(tb)), c.AIWorker.Namespace
	return func(id string) string { return "pod" + podUID(tb, cs, ns, id) }
}

// podUID is the uid of task id's pod in namespace ns.
func podUID(tb testing.TB, cs kubernetes.Interface, ns, id string) string {
	tb.Helper()
	var uid string
	k8stest.WaitFor(tb, "the pod of task "+id, func() bool {
		pods, err := cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: sandbox.LabelTaskID + "=" + id})
		if err == nil && len(pods.Items) == 1 {
			uid = string(pods.Items[0].UID)
		}
		return uid != ""
	})
	return uid
}

// waitFile waits up to a minute for the file at path.
func waitFile(t *testing.T, path string) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never appeared", path)
		}
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

// keyScan looks for needle in every host process of a sandbox (those whose
// cgroup path holds id: the local runtime's processes, gVisor's sentry and
// gofer, a pod's): their environment, command line and readable memory.
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

// memContains reads every page of process dir (/proc/PID) that is in
// memory, in its readable mappings, and returns where it found needle (""
// if nowhere): " at 0xADDR (path)". Pages not in memory are passed over
// (/proc/PID/pagemap): reading them would fault them in, and a sandbox's
// memory limit counts what a scan of gVisor's guest memory faults in.
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
	pagemap, err := os.Open(dir + "/pagemap")
	if err != nil {
		return ""
	}
	defer pagemap.Close()
	const page = 4096
	entries, buf := make([]byte, 8*512), make([]byte, page)
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
		// Runs of pages present, read whole.
		var run []byte
		runAt := uint64(0)
		flush := func() string {
			if i := bytes.Index(run, needle); i >= 0 {
				return fmt.Sprintf(" at %#x (%s)", runAt+uint64(i), name)
			}
			run = run[:0]
			return ""
		}
		for addr := start; addr < end; addr += 512 * page {
			n := min(512, (end-addr)/page)
			k, _ := pagemap.ReadAt(entries[:8*n], int64(addr/page*8))
			for i := 0; i+8 <= k; i += 8 {
				at := addr + uint64(i/8)*page
				if binary.LittleEndian.Uint64(entries[i:])&(1<<63) == 0 {
					if where := flush(); where != "" {
						return where
					}
					continue
				}
				if len(run) == 0 {
					runAt = at
				}
				if m, err := mem.ReadAt(buf, int64(at)); err != nil || m != page {
					if where := flush(); where != "" {
						return where
					}
					continue
				}
				run = append(run, buf...)
				if len(run) >= 4<<20 {
					// Keep the tail: the needle may go on in the next page.
					keep := len(needle) - 1
					tail := run[len(run)-keep:]
					if where := flush(); where != "" {
						return where
					}
					run, runAt = append(run, tail...), at+page-uint64(keep)
				}
			}
		}
		if where := flush(); where != "" {
			return where
		}
	}
	return ""
}
