package workerproto

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// What the server builds, the worker reads back as it was meant: every
// field, set or left to its default.
func TestArgvParsesBack(t *testing.T) {
	full := Args{
		TaskID: "task-1", TaskDir: "/task", PromptPath: "/task/prompt.md", Agent: "claude", Model: "opus",
		Binary: "/usr/local/bin/claude", AgentArgs: []string{"-c", "model_providers.corral.supports_websockets=true", "", "--"}, Resume: "sess-1", WebhookURL: "unix:///run/corral/sock/corral.sock", Source: "gvisor",
		EgressSocket: "/run/corral/egress/proxy.sock", EgressListen: "127.0.0.1:3129",
		EgressForward: []string{"127.0.0.1:8080", "[::1]:11434"}, MaxLogBytes: 1 << 20, Grace: 3 * time.Second,
	}
	command := Args{TaskID: "task-2", Agent: "command", Command: []string{"sh", "-c", "echo --not-a-flag"}}
	for _, a := range []Args{full, command} {
		argv := a.Argv()
		if argv[0] != "worker" || argv[1] != "run-task" {
			t.Fatalf("argv %q does not start with worker run-task", argv)
		}
		got, err := ParseArgs(argv[2:])
		if err != nil {
			t.Fatalf("ParseArgs(%q): %v", argv, err)
		}
		want := a
		// What was left out takes its default.
		if want.TaskDir == "" {
			want.TaskDir = TaskDir
		}
		if want.PromptPath == "" {
			want.PromptPath = TaskDir + "/" + PromptFile
		}
		if want.Source == "" {
			want.Source = DefaultSource
		}
		if want.EgressListen == "" {
			want.EgressListen = DefaultEgressListen
		}
		if want.MaxLogBytes == 0 {
			want.MaxLogBytes = DefaultMaxLogBytes
		}
		if want.Grace == 0 {
			want.Grace = DefaultGrace
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("argv %q parsed as\n%+v\nwant\n%+v", argv, got, want)
		}
	}
}

func TestParseArgsRefuses(t *testing.T) {
	for _, c := range []struct {
		argv  []string
		field string
	}{
		{[]string{"--agent", "claude"}, "--task-id"},
		{[]string{"--task-id", "../x"}, "--task-id"},
		{[]string{"--task-id", "t", "--grace", "-1s"}, "--grace"},
		{[]string{"--task-id", "t", "--max-log-bytes", "0"}, "--max-log-bytes"},
		{[]string{"--task-id", "t", "--egress-listen", "nope"}, "--egress-listen"},
		{[]string{"--task-id", "t", "--egress-socket", "/s", "--egress-forward", "10.0.0.1:80"}, "--egress-forward"},
		{[]string{"--task-id", "t", "--egress-forward", "127.0.0.1:80"}, "--egress-forward"},
	} {
		if _, err := ParseArgs(c.argv); err == nil || !strings.Contains(err.Error(), c.field+": ") {
			t.Errorf("%q: %v, want a %s error", c.argv, err, c.field)
		}
	}
}
