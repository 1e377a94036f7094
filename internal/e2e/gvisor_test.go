//go:build integration

package e2e_test

import (
	"context"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestGvisorTask runs a command task under the gvisor runtime through the
// real server: the worker runs in gVisor, writes an output file and reports
// over the unix socket mounted into the sandbox, which only works if
// runsc lets the sandbox connect to the host's socket.
func TestGvisorTask(t *testing.T) {
	testenv.RequireRunsc(t)
	t.Parallel()
	s := MustStart(t, func(c *config.Config) { c.Runtime = "gvisor" })
	tk := mustSpawn(t, s.client, service.SpawnRequest{
		TaskDescription: "write a file under gVisor",
		Agent:           task.AgentCommand,
		Runtime:         "gvisor",
		Command:         []string{"sh", "-c", `printf 'written in gvisor by %s\n' "$(id -un)" > output/hello.txt && echo done`},
	})
	res := s.waitSuccess(t, tk.ID, 60*time.Second, "hello.txt")
	if got := res.FileContents["hello.txt"].Content; got != "written in gvisor by worker\n" {
		t.Errorf("hello.txt = %q", got)
	}
	if res.Summary != "done" {
		t.Errorf("summary %q, want done", res.Summary)
	}
	got, err := s.client.Get(context.Background(), tk.ID)
	if err != nil || got.Runtime != "gvisor" {
		t.Errorf("task runtime = %q, %v; want gvisor", got.Runtime, err)
	}
}
