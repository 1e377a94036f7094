//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/app"
	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// TestDestroySandboxesLeavesNothing: a throwaway server (the bench, a
// test) stopped with a task still running destroys its sandbox — the
// processes and the cgroups named after the task — so nothing of it
// outlives the server.
func TestDestroySandboxesLeavesNothing(t *testing.T) {
	testenv.RequireBwrap(t)
	t.Parallel()
	cfg, err := config.Load(config.LoadOptions{Environ: []string{}})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen, cfg.Data = "127.0.0.1:0", testenv.TempDir(t)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	a, err := app.New(ctx, cfg, slog.New(slog.NewTextHandler(testWriter{t}, nil)), app.Options{WorkerBinary: corralBin})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	served := make(chan error, 1)
	go func() { served <- a.Run(ctx) }()
	url := "http://" + a.Addr()
	waitHealthy(t, url)
	s := &server{app: a, client: httpapi.NewClient(url, a.Token()), url: url, data: cfg.Data}
	tk, _, err := s.client.Spawn(ctx, service.SpawnRequest{TaskDescription: "long", Agent: "command", Command: []string{"sleep", "60.02"}})
	if err != nil {
		t.Fatal(err)
	}
	s.waitStatus(t, tk.ID, task.Running, 20*time.Second)
	var st struct {
		Cgroups []string `json:"cgroups"`
	}
	b, err := os.ReadFile(filepath.Join(cfg.Data, "run", "local", tk.ID, "state.json"))
	if err != nil || json.Unmarshal(b, &st) != nil {
		t.Fatalf("sandbox state: %v %s", err, b)
	}
	stop()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	if !processRunning("sleep", "60.02") {
		t.Fatal("the worker died with the server; the test proves nothing")
	}
	if err := a.DestroySandboxes(context.Background()); err != nil {
		t.Fatal(err)
	}
	if processRunning("sleep", "60.02") {
		t.Error("the task's process outlived DestroySandboxes")
	}
	for _, d := range st.Cgroups {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("cgroup %s left behind: %v", d, err)
		}
	}
}
