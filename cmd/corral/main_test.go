package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/webhook"
	"github.com/corral-dev/corral/internal/workspace"
)

// -h and --help print a command's usage and succeed; a bad flag is a
// usage error (2); version prints the build.
func TestHelpAndVersion(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string // in stdout or stderr
	}{
		{[]string{"--help"}, 0, "Usage:"},
		{[]string{"help", "run"}, 0, "corral run \"TASK\" [flags]"},
		{[]string{"--version"}, 0, "corral "},
		{[]string{"-v"}, 0, "corral "},
		{[]string{"bogus"}, 2, `unknown command "bogus" for "corral"`},
		{[]string{"run", "--help"}, 0, "--agent"},
		{[]string{"tasks", "-h"}, 0, "--status"},
		{[]string{"serve", "--help"}, 0, "--listen"},
		{[]string{"ws", "ls", "--help"}, 0, "--json"},
		{[]string{"ws", "--help"}, 0, "corral ws [command]"},
		{[]string{"attachments", "-h"}, 0, "get         Download an attachment"},
		{[]string{"tasks", "--bogus"}, 2, "bogus"},
		{[]string{"k8s", "--help"}, 0, "render      The manifests"},
		{[]string{"k8s", "render", "--help"}, 0, "--server-image"},
		{[]string{"k8s"}, 2, "give a command: render, seccomp"},
		{[]string{"k8s", "apply"}, 2, `unknown k8s command "apply"`},
		{[]string{"k8s", "render", "--storage", "lots"}, 2, "--storage: must be a positive quantity"},
		{[]string{"k8s", "seccomp", "--arch", "mips"}, 2, `no seccomp profile for architecture "mips" (one of amd64, arm64)`},
		{[]string{"k8s", "seccomp", "--arch", "arm64"}, 0, `"sync_file_range2"`},
		{[]string{"k8s", "seccomp", "extra"}, 2, `unexpected argument "extra"`},
		{[]string{"version"}, 0, "corral "},
		{[]string{"notify-secret"}, 0, "notify.previous_secret_file"},
		{[]string{"notify-secret", "x"}, 2, `unexpected argument "x"`},
	} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), tc.args, &stdout, &stderr)
		if code != tc.code || !strings.Contains(stdout.String()+stderr.String(), tc.out) {
			t.Errorf("corral %s: exit %d, want %d; output %q, want %q in it", strings.Join(tc.args, " "), code, tc.code, stdout.String()+stderr.String(), tc.out)
		}
	}
}

// closedURL is the URL of a loopback port where nothing listens.
func closedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	return "http://" + l.Addr().String()
}

// TestClientCommandsTakeNoServerFlags: a client command refuses the
// server's flags as usage errors rather than ignoring them.
func TestClientCommandsTakeNoServerFlags(t *testing.T) {
	url := closedURL(t)
	cmds := [][]string{
		{"run", "x"}, {"tasks"}, {"result", "task-1"}, {"logs", "task-1"}, {"cancel", "task-1"},
		{"ws", "ls"}, {"skills"}, {"tools"}, {"attachments", "put", "f"}, {"gc"},
	}
	for _, cmd := range cmds {
		for _, flag := range [][]string{{"--runtime", "gvisor"}, {"--data", "/d"}, {"--listen", "127.0.0.1:1"}, {"--max-concurrent", "3"}} {
			if cmd[0] == "run" && flag[0] == "--runtime" {
				continue // the task's own runtime
			}
			args := append(append(slices.Clone(cmd), "--server", url), flag...)
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), args, &stdout, &stderr)
			if code != 2 || !strings.Contains(stderr.String(), "unknown flag: "+flag[0]) {
				t.Errorf("corral %s: exit %d, %q; want 2 and the flag refused", strings.Join(args, " "), code, stderr.String())
			}
		}
	}
}

// TestRunSendsTheTaskSettings: every spawn_worker field a person sets has
// a flag of corral run, and reaches the server.
func TestRunSendsTheTaskSettings(t *testing.T) {
	var got service.SpawnRequest
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/tasks", func(w http.ResponseWriter, r *http.Request) {
		json.NewDecoder(r.Body).Decode(&got)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"task_id":"task-1","status":"queued"}`)
	})
	mux.HandleFunc("GET /api/tasks/task-1", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"task_id":"task-1","status":"queued"}`)
	})
	hs := httptest.NewServer(mux)
	defer hs.Close()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"run", "--server", hs.URL,
		"--runtime", "gvisor", "--image", "python:3.13", "--network", "open",
		"--memory", "2Gi", "--cpu", "500m", "--pids", "64", "--timeout", "2h",
		"--label", "team=data", "--label", "ticket=42", "--conversation-id", "conv-1",
		"--document", "doc-1", "--note-query", "budget", "--agent", "command", "--context", "data/a.csv",
		"count the rows", "--", "wc", "-l"}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("corral run: exit %d: %s", code, stderr.String())
	}
	want := service.SpawnRequest{
		TaskDescription: "count the rows", Command: []string{"wc", "-l"}, Agent: "command", ContextFiles: []string{"data/a.csv"},
		Runtime: "gvisor", Image: "python:3.13", Network: "open",
		Resources:      &service.ResourceRequest{MemoryLimit: "2Gi", CPULimit: "500m", PidsLimit: 64},
		TimeoutMinutes: new(120), Labels: map[string]string{"team": "data", "ticket": "42"}, ConversationID: "conv-1",
		DocumentIDs: []string{"doc-1"}, NoteQuery: "budget",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("spawn request (-want +got):\n%s", diff)
	}
	for _, bad := range [][]string{{"--label", "novalue"}, {"--timeout", "90s"}} {
		code := run(context.Background(), append([]string{"run", "--server", hs.URL, "x"}, bad...), io.Discard, io.Discard)
		if code != 2 {
			t.Errorf("corral run %s: exit %d, want 2", strings.Join(bad, " "), code)
		}
	}
}

// TestNoServerSaysHowToStartOne: with no server running, a client command
// says so and how to start one, not how the dial failed.
func TestNoServerSaysHowToStartOne(t *testing.T) {
	url := closedURL(t)
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"tasks", "--server", url}, &stdout, &stderr)
	want := "corral tasks: no corral server is running at " + url + "\nstart one with `corral serve`"
	if code != exitUnreachable || !strings.HasPrefix(stderr.String(), want) || strings.Contains(stderr.String(), "dial tcp") {
		t.Errorf("exit %d, %q; want %d and %q", code, stderr.String(), exitUnreachable, want)
	}
}

// TestErrorsEndInWords: an error is printed as a person should read it,
// without the class it is filed under.
func TestErrorsEndInWords(t *testing.T) {
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"run", "--server", closedURL(t)}, io.Discard, &stderr)
	if want := "corral run: give the task description: corral run \"what to do\" [-- CMD ARGS...]\nRun 'corral run --help' for usage.\n"; code != 2 || stderr.String() != want {
		t.Errorf("exit %d, %q; want 2 and %q", code, stderr.String(), want)
	}
}

// workspaceBackend is a server backend whose workspace checks paths as the
// library does; nothing else of it is called.
type workspaceBackend struct{ service.Library }

func (workspaceBackend) ListWorkspace(_ context.Context, p string, _ bool) ([]workspace.Entry, error) {
	_, err := workspace.Clean(p)
	return []workspace.Entry{}, err
}
func (workspaceBackend) WorkerComplete(context.Context, webhook.Signed) (string, error) {
	return "", nil
}
func (workspaceBackend) OpenOutput(context.Context, string, string) (*os.File, fs.FileInfo, error) {
	return nil, nil, nil
}
func (workspaceBackend) OpenShared(context.Context, string) (*os.File, fs.FileInfo, error) {
	return nil, nil, nil
}
func (workspaceBackend) Stats() httpapi.Stats { return httpapi.Stats{} }

// TestWorkspacePathEscapes: ws cat ../x reaches the server as ../x, which
// refuses it in words.
func TestWorkspacePathEscapes(t *testing.T) {
	hs := httptest.NewServer(httpapi.New(service.Set{Library: workspaceBackend{}}, workspaceBackend{}, httpapi.Options{}, slog.New(slog.DiscardHandler)).Handler())
	defer hs.Close()
	var stderr bytes.Buffer
	code := run(context.Background(), []string{"ws", "cat", "--server", hs.URL, "../x"}, io.Discard, &stderr)
	if want := "corral ws cat: path \"../x\" contains \"..\": path escapes workspace\n"; code != 1 || stderr.String() != want {
		t.Errorf("ws cat ../x: exit %d, %q; want 1 and %q", code, stderr.String(), want)
	}
}

// TestLocalFileErrorsNameTheFile: an error about a local file names it,
// although messages leave out the absolute paths of system calls' errors.
func TestLocalFileErrorsNameTheFile(t *testing.T) {
	missing := t.TempDir() + "/missing.csv"
	for _, args := range [][]string{
		{"ws", "put", "data/x.csv", missing},
		{"skills", "create", "--file", missing},
	} {
		var stderr bytes.Buffer
		run(context.Background(), append(args, "--server", closedURL(t)), io.Discard, &stderr)
		if want := "read " + missing + ": no such file or directory\n"; !strings.HasSuffix(stderr.String(), want) {
			t.Errorf("corral %s: %q, want it to end in %q", strings.Join(args, " "), stderr.String(), want)
		}
	}
}

// corral k8s render writes the stream to stdout, from --config.
func TestK8sRender(t *testing.T) {
	cfg := t.TempDir() + "/corral.yaml"
	if err := os.WriteFile(cfg, []byte("ai_worker_config: {namespace: corral-ns}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"k8s", "render", "--config", cfg, "--server-image", "corral:v1", "--storage-class", "rwx"}, &stdout, &stderr)
	out := stdout.String()
	if code != 0 || !strings.HasPrefix(out, "# Corral on Kubernetes, rendered by `corral k8s render` from "+cfg) {
		t.Fatalf("exit %d, stderr %q, stdout %.200q", code, stderr.String(), out)
	}
	for _, want := range []string{"kind: Deployment", "namespace: corral-ns", "image: corral:v1", "storageClassName: rwx"} {
		if !strings.Contains(out, want) {
			t.Errorf("the stream has no %q", want)
		}
	}
	// A configuration that names a missing file is an error, as for every command.
	code = run(context.Background(), []string{"k8s", "render", "--config", cfg + ".missing"}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "corral k8s render: configuration: read config file") {
		t.Errorf("missing config: exit %d, %q", code, stderr.String())
	}
	// On PostgreSQL, replicas, with no connection string here: the
	// cluster's servers read theirs from their Secret.
	pg := t.TempDir() + "/pg.yaml"
	if err := os.WriteFile(pg, []byte("store: {driver: postgres}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	stderr.Reset()
	t.Setenv("CORRAL_STORE_DSN", "")
	os.Unsetenv("CORRAL_STORE_DSN")
	code = run(context.Background(), []string{"k8s", "render", "--config", pg}, &stdout, &stderr)
	if out := stdout.String(); code != 0 || !strings.Contains(out, "replicas: 2") || !strings.Contains(out, "kind: PodDisruptionBudget") {
		t.Errorf("postgres: exit %d, stderr %q; want two replicas and a disruption budget", code, stderr.String())
	}
	// The default image is this binary's version.
	if img := defaultServerImage(); !strings.HasPrefix(img, "corral:") || strings.ContainsAny(img, " ()") {
		t.Errorf("default server image %q", img)
	}
}
