//go:build integration

package e2e_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestDockerImages: a task on docker runs the configured image unless it
// names one; an image outside allowed_images is refused before anything
// starts, naming the patterns; an agent missing from the image says so.
func TestDockerImages(t *testing.T) {
	testenv.RequireDocker(t)
	t.Parallel()
	s := MustStart(t, func(c *config.Config) {
		c.AIWorker.AllowedImages = []string{"corral-test/*"}
		// A key, for the spawn of claude to be taken and find claude
		// missing from the image when it starts.
		c.Agents.Claude.Env = map[string]string{"ANTHROPIC_API_KEY": "sk-ant-test-never-sent"}
	})
	ctx := context.Background()

	tk := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "which system", Runtime: "docker",
		Command: []string{"sh", "-c", ". /etc/os-release; echo $VERSION_CODENAME > output/os.txt"}})
	if tk.Image != testenv.DockerImage {
		t.Errorf("task image %q, want the default %q", tk.Image, testenv.DockerImage)
	}
	res := s.wait(t, tk.ID, 60*time.Second)
	if b, _ := os.ReadFile(filepath.Join(s.data, "tasks", tk.ID, "output", "os.txt")); res.Status != task.Success || string(b) != "bookworm\n" {
		t.Errorf("task on docker: %s %s, wrote %q; want success and bookworm", res.Status, res.ErrorMessage, b)
	}

	_, _, err := s.client.Spawn(ctx, service.SpawnRequest{TaskDescription: "x", Runtime: "docker", Image: "python:3.12-slim", Command: []string{"true"}})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "corral-test/*") {
		t.Errorf("an image outside the allowlist: %v, want a 422 naming the patterns", err)
	}

	tk = mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "no claude here", Runtime: "docker", Agent: "claude"})
	res = s.wait(t, tk.ID, 60*time.Second)
	if want := "claude is not installed in image " + testenv.DockerImage; res.Status != task.Failed || !strings.Contains(res.ErrorMessage, want) {
		t.Errorf("an agent missing from the image: %s %q, want failed saying %q", res.Status, res.ErrorMessage, want)
	}
}

// TestDockerAnyImage: the worker reaches the container as Corral's own
// static binary, bind-mounted, so a task runs in an image with no libc and
// nothing of Corral's.
func TestDockerAnyImage(t *testing.T) {
	testenv.RequireDocker(t)
	t.Parallel()
	s := MustStart(t, nil)
	tk := mustSpawn(t, s.client, service.SpawnRequest{TaskDescription: "busybox only", Runtime: "docker", Image: testenv.DockerBusyboxImage,
		Command: []string{"sh", "-c", "ls / > output/root.txt"}})
	res := s.wait(t, tk.ID, 60*time.Second)
	b, _ := os.ReadFile(filepath.Join(s.data, "tasks", tk.ID, "output", "root.txt"))
	if res.Status != task.Success || strings.Contains(string(b), "usr") || !strings.Contains(string(b), "task") {
		t.Errorf("task in %s: %s %s, / holds %q; want success in a root without /usr", testenv.DockerBusyboxImage, res.Status, res.ErrorMessage, b)
	}
}

// TestDockerKill9: a server killed with SIGKILL while a docker task runs
// finds the task's container after a restart, records its real result, and
// leaves no container behind.
func TestDockerKill9(t *testing.T) {
	testenv.RequireDocker(t)
	t.Parallel()
	data := testenv.TempDir(t)
	cfgFile := filepath.Join(t.TempDir(), "corral.yaml")
	if err := os.WriteFile(cfgFile, []byte("runtime: docker\nai_worker_config:\n  ai_coder_image: "+testenv.DockerImage+"\ndocker:\n  host: unix://"+testenv.DockerSocket+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	srv := startProcess(t, data, "--config", cfgFile)
	tk := mustSpawn(t, srv.client, service.SpawnRequest{TaskDescription: "runs across the restart",
		Command: []string{"sh", "-c", "while [ ! -e /task/go ]; do sleep 0.05; done; echo survived > output/result.txt"}})
	if tk.Runtime != "docker" {
		t.Fatalf("task runtime %q, want docker", tk.Runtime)
	}
	srv.waitRunning(t, tk.ID, 30*time.Second)
	srv.kill()
	if n := containers(t, tk.ID); n != 1 {
		t.Fatalf("%d containers for the task after the server died, want its one still running", n)
	}
	// The worker finishes while no server runs.
	if err := os.WriteFile(filepath.Join(data, "tasks", tk.ID, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	srv = startProcess(t, data, "--config", cfgFile)
	res, err := srv.client.Result(ctx, service.ResultRequest{TaskID: tk.ID, Wait: 60 * time.Second, IncludeFileContents: []string{"result.txt"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != task.Success || res.FileContents["result.txt"].Content != "survived\n" {
		t.Errorf("after the restart: %s %q (%s), want success with survived", res.Status, res.FileContents["result.txt"].Content, res.ErrorMessage)
	}
	for deadline := time.Now().Add(15 * time.Second); containers(t, tk.ID) != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the task's container was not removed")
		}
	}
}

// containers counts the engine's containers, running or not, labelled
// with task id.
func containers(t *testing.T, id string) int {
	t.Helper()
	out, err := exec.Command("docker", "-H", "unix://"+testenv.DockerSocket, "ps", "-aq", "--filter", "label=corral.task-id="+id).Output()
	if err != nil {
		t.Fatalf("docker ps: %v", err)
	}
	return len(strings.Fields(string(out)))
}
