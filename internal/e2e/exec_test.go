//go:build integration

package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// execChartScript reads /workspace/input/spending.csv and draws a bar chart of
// it into /workspace/output/chart.png.
const execChartScript = `python3 - <<'PY'
import csv, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = list(csv.DictReader(open("/workspace/input/spending.csv")))
plt.bar([r["category"] for r in rows], [float(r["amount"]) for r in rows])
plt.savefig("/workspace/output/chart.png")
print("charted", len(rows), "categories")
PY`

// withExec turns code_execute on, which a server leaves off unless asked.
func withExec(c *config.Config) { c.Execution.Enabled = true }

// TestCodeExecuteChart is seed 004 end to end: an uploaded CSV, a command
// in the Python image that charts it, and the chart back as an attachment.
func TestCodeExecuteChart(t *testing.T) {
	testenv.RequireDocker(t)
	t.Parallel()
	s := MustStart(t, func(c *config.Config) {
		withExec(c)
		c.Runtime = "docker"
		c.Execution.DefaultImage = testenv.DockerPythonImage
		c.Execution.AllowedImages = []string{"corral-test/*"}
	})
	ctx := context.Background()
	csv := "category,amount\ngroceries,412.50\nrent,1200\ntransport,86.20\n"
	atts, err := s.client.UploadAttachments(ctx, oneFile("spending.csv", csv))
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.client.Execute(ctx, service.ExecRequest{Command: execChartScript, AttachmentIDs: []string{atts[0].ID}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Success || res.ExitCode == nil || *res.ExitCode != 0 || res.Stdout != "charted 3 categories\n" {
		t.Fatalf("code_execute = %+v, want success printing charted 3 categories", res)
	}
	if len(res.OutputFiles) != 1 || res.OutputFiles[0].Name != "chart.png" || res.OutputFiles[0].AttachmentID == "" {
		t.Fatalf("output files %+v, want chart.png as an attachment", res.OutputFiles)
	}
	m, body, err := s.client.OpenAttachment(ctx, res.OutputFiles[0].AttachmentID)
	if err != nil {
		t.Fatal(err)
	}
	png, _ := io.ReadAll(body)
	body.Close()
	if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) || m.Name != "chart.png" {
		t.Errorf("attachment %s: %d bytes starting %q, want a PNG", m.Name, len(png), png[:min(8, len(png))])
	}
	// The call is a task of kind exec, listed with the others.
	tk, err := s.client.Get(ctx, res.TaskID)
	if err != nil || tk.Kind != task.KindExec || tk.Image != testenv.DockerPythonImage {
		t.Errorf("the call's task = kind %q image %q, %v; want exec in %s", tk.Kind, tk.Image, err, testenv.DockerPythonImage)
	}
}

// TestCodeExecuteEdges: seed 004's edge cases each give a clear answer.
func TestCodeExecuteEdges(t *testing.T) {
	testenv.RequireDocker(t)
	t.Parallel()
	s := MustStart(t, func(c *config.Config) {
		withExec(c)
		c.Runtime = "docker"
		c.Execution.AllowedImages = []string{"corral-test/*"}
		c.Execution.MaxOutputSize = mustSizeTB(t, "1KiB")
	})
	ctx := context.Background()

	// An image outside the allowlist: refused before anything starts.
	_, err := s.client.Execute(ctx, service.ExecRequest{Command: "true", Image: "python:3.12-slim"})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "corral-test/*") {
		t.Errorf("image outside the allowlist: %v, want 422 naming the patterns", err)
	}
	// No output files: an empty list, and the exit code.
	res, err := s.client.Execute(ctx, service.ExecRequest{Command: "echo to stderr >&2; exit 3"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Success || res.ExitCode == nil || *res.ExitCode != 3 || res.Stderr != "to stderr\n" || len(res.OutputFiles) != 0 {
		t.Errorf("exit 3: %+v, want failure with code 3, stderr and no files", res)
	}
	// Output over the limit: cut, and said.
	res, err = s.client.Execute(ctx, service.ExecRequest{Command: "head -c 5000 /dev/zero | tr '\\0' x"})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Success || len(res.Stdout) != 1024 || !res.StdoutTruncated {
		t.Errorf("5000 bytes of output: %d bytes back, truncated %v; want 1024 and truncated", len(res.Stdout), res.StdoutTruncated)
	}
	// A timeout: the call ends at its limit and its container is gone.
	start := time.Now()
	res, err = s.client.Execute(ctx, service.ExecRequest{Command: "sleep 60", TimeoutSeconds: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != task.Timeout || time.Since(start) > 30*time.Second || !strings.Contains(res.Error, "timed out") {
		t.Errorf("sleep 60 with a 2 s limit: %s %q after %s, want timeout", res.Status, res.Error, time.Since(start))
	}
	for deadline := time.Now().Add(15 * time.Second); containers(t, res.TaskID) != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Error("the timed-out call's container is still there")
			break
		}
	}
	// An image on a host runtime: refused, saying why.
	_, err = s.client.Execute(ctx, service.ExecRequest{Command: "true", Runtime: "local", Image: testenv.DockerImage})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "takes no image") {
		t.Errorf("an image on local: %v, want 422 saying local takes no image", err)
	}
	// The network is off unless the server allows it.
	_, err = s.client.Execute(ctx, service.ExecRequest{Command: "true", Network: true})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "network_enabled") {
		t.Errorf("network on a server without it: %v, want 422 naming execution.network_enabled", err)
	}
}

// TestCodeExecuteLocal: code_execute on the host runtime, over the host's
// /usr.
func TestCodeExecuteLocal(t *testing.T) {
	t.Parallel()
	s := MustStart(t, withExec)
	res, err := s.client.Execute(context.Background(), service.ExecRequest{Command: "pwd; ls; echo hi > output/hi.txt", TimeoutSeconds: 30})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Success || res.Stdout != "/workspace\ninput\noutput\nshared\n" || len(res.OutputFiles) != 1 || res.OutputFiles[0].Name != "hi.txt" {
		t.Errorf("code_execute on local = %+v, want it in /workspace with input, output and shared, and hi.txt back", res)
	}
}

// TestCodeExecuteEngineDown: with no engine, the docker runtime is
// unavailable and a call on it says so; the others keep working.
func TestCodeExecuteEngineDown(t *testing.T) {
	t.Parallel()
	s := MustStart(t, func(c *config.Config) {
		withExec(c)
		c.Docker.Host = "unix:///nonexistent/docker.sock"
	})
	_, err := s.client.Execute(context.Background(), service.ExecRequest{Command: "true", Runtime: "docker"})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "cannot be reached") {
		t.Errorf("docker with no engine: %v, want 422 saying the engine cannot be reached", err)
	}
	if res, err := s.client.Execute(context.Background(), service.ExecRequest{Command: "echo ok"}); err != nil || res.Stdout != "ok\n" {
		t.Errorf("local beside a missing engine: %+v, %v", res, err)
	}
}

// oneFile is an UploadAttachments source of one file.
func oneFile(name, content string) func() (string, io.Reader, error) {
	sent := false
	return func() (string, io.Reader, error) {
		if sent {
			return "", nil, io.EOF
		}
		sent = true
		return name, strings.NewReader(content), nil
	}
}

// TestCodeExecuteOff: by default (execution.enabled false) code_execute is
// not in the tool list (MCP's is the same catalogue), and a call is
// refused with 503, saying which key turns it on.
func TestCodeExecuteOff(t *testing.T) {
	t.Parallel()
	s := MustStart(t, nil)
	var fns []struct {
		Name string `json:"name"`
	}
	_, body := s.do(t, "GET", "/api/tools", "", nil)
	if err := json.Unmarshal([]byte(body), &fns); err != nil || len(fns) == 0 {
		t.Fatalf("GET /api/tools: %v %s", err, body)
	}
	for _, f := range fns {
		if f.Name == "code_execute" {
			t.Errorf("code_execute is listed while execution is off")
		}
	}
	if code, body := s.do(t, "POST", "/api/exec", "application/json", strings.NewReader(`{"command":"true"}`)); code != http.StatusServiceUnavailable || !strings.Contains(body, "execution.enabled") {
		t.Errorf("POST /api/exec while execution is off: %d %s, want 503 naming execution.enabled", code, body)
	}
}
