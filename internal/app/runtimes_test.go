package app

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/rtkind"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/tools"
	"github.com/corral-dev/corral/internal/workerproto"
)

// The runtime names come from rtkind.Names(): every one is either built
// by openRuntime or says why not (kubernetes, with no cluster or server
// URL configured), and spawn_worker's schema offers exactly them.
func TestRuntimeNamesAgree(t *testing.T) {
	t.Setenv("KUBECONFIG", "")
	cfg := config.Default()
	for _, name := range rtkind.Names() {
		rt, err := openRuntime(name, cfg, t.TempDir(), t.TempDir(), "", hostuser.Default(), nil, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Errorf("runtime %s: %v", name, err)
		}
		if c, ok := rt.(io.Closer); ok {
			c.Close()
		}
		if rt == nil && unconfigured(name, cfg) == "" {
			t.Errorf("runtime %s is neither built nor said why not", name)
		}
	}
	var schema struct {
		Properties struct {
			Runtime struct {
				Enum []string `json:"enum"`
			} `json:"runtime"`
		} `json:"properties"`
	}
	for _, tl := range tools.New(service.Set{}, tools.Limits{}).All() {
		if tl.Name == "spawn_worker" {
			if err := json.Unmarshal(tl.Schema, &schema); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !slices.Equal(schema.Properties.Runtime.Enum, rtkind.Names()) {
		t.Errorf("spawn_worker offers runtimes %v, config has %v", schema.Properties.Runtime.Enum, rtkind.Names())
	}
}

// TestCheckModelAPIs: an agent's base URL the egress could not relay to is
// refused at start, naming the agent's env; one it can is taken.
func TestCheckModelAPIs(t *testing.T) {
	cfg := config.Default()
	cfg.Agents.Claude.Env = map[string]string{"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": "http://127.0.0.1:8080"}
	if err := checkModelAPIs(agentConfigs(cfg)); err != nil {
		t.Errorf("a usable base URL: %v", err)
	}
	cfg.Agents.Codex.Env = map[string]string{"OPENAI_API_KEY": "k", "OPENAI_BASE_URL": "ftp://user:secret@example.com/v1"}
	err := checkModelAPIs(agentConfigs(cfg))
	if err == nil || !strings.Contains(err.Error(), "agents.codex.env") || !errors.Is(err, errdefs.ErrInvalidArgument) || strings.Contains(err.Error(), "secret") {
		t.Errorf("an ftp base URL: %v; want refused, naming agents.codex.env, without its password", err)
	}
}

// A spawn is refused for an agent whose configured environment sets none
// of the variables it authenticates with (an empty one counts as unset),
// naming them and where to set them; one of them is enough, and the
// command agent needs none.
func TestAgentNoCredentials(t *testing.T) {
	for _, c := range []struct {
		name string
		env  []string
		want string // "" for taken
	}{
		{"claude", nil, "set one of ANTHROPIC_API_KEY, ANTHROPIC_AUTH_TOKEN, CLAUDE_CODE_OAUTH_TOKEN in agents.claude.env"},
		{"claude", []string{"ANTHROPIC_API_KEY=", "ANTHROPIC_BASE_URL=http://127.0.0.1:1"}, "agents.claude.env"},
		{"claude", []string{"CLAUDE_CODE_OAUTH_TOKEN=tok"}, ""},
		{"codex", []string{"ANTHROPIC_API_KEY=k"}, "set OPENAI_API_KEY in agents.codex.env"},
		{"gemini", []string{"GOOGLE_API_KEY=k"}, ""},
		{"command", nil, ""},
	} {
		got := agentNoCredentials(c.name, workerproto.AgentConfig{Env: c.env})
		if c.want == "" && got != "" || c.want != "" && !strings.Contains(got, c.want) {
			t.Errorf("%s with %q: %q, want %q", c.name, c.env, got, c.want)
		}
	}
}
