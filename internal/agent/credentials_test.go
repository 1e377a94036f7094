package agent

import (
	"slices"
	"strings"
	"testing"
)

// TestModelAPIs: each agent's keys become placeholders in the sandbox's
// environment and model APIs the egress relays, with the API's header,
// the configured base URL or the API's own, one per base URL variable
// (the first key set); what is not a key stays as it is.
func TestModelAPIs(t *testing.T) {
	for _, tt := range []struct {
		agent      string
		configured []string
		env        []string
		apis       []ModelAPI
	}{
		{"claude", []string{"ANTHROPIC_API_KEY=sk-a", "CLAUDE_CODE_MAX_RETRIES=1"},
			[]string{"ANTHROPIC_API_KEY=" + KeyPlaceholder, "CLAUDE_CODE_MAX_RETRIES=1"},
			[]ModelAPI{{"ANTHROPIC_BASE_URL", "https://api.anthropic.com", "X-Api-Key", "sk-a"}}},
		{"claude", []string{"ANTHROPIC_AUTH_TOKEN=gw-token-5", "ANTHROPIC_BASE_URL=http://127.0.0.1:8080", "ANTHROPIC_API_KEY="},
			[]string{"ANTHROPIC_AUTH_TOKEN=" + KeyPlaceholder},
			[]ModelAPI{{"ANTHROPIC_BASE_URL", "http://127.0.0.1:8080", "Authorization", "Bearer gw-token-5"}}},
		{"gemini", []string{"GOOGLE_API_KEY=g-key-3", "GEMINI_API_KEY=gem-key-4"},
			[]string{"GOOGLE_API_KEY=" + KeyPlaceholder, "GEMINI_API_KEY=" + KeyPlaceholder},
			[]ModelAPI{{"GOOGLE_GEMINI_BASE_URL", "https://generativelanguage.googleapis.com", "X-Goog-Api-Key", "gem-key-4"}}},
		{"codex", []string{"OPENAI_API_KEY=sk-openai-1", "OPENAI_BASE_URL=http://127.0.0.2:1/v1"},
			[]string{"OPENAI_API_KEY=" + KeyPlaceholder},
			[]ModelAPI{{"OPENAI_BASE_URL", "http://127.0.0.2:1/v1", "Authorization", "Bearer sk-openai-1"}}},
		{"opencode", []string{"OPENAI_API_KEY=sk-openai-1", "ANTHROPIC_API_KEY=sk-ant-2", "OPENCODE_CONFIG_CONTENT={}"},
			[]string{"OPENAI_API_KEY=" + KeyPlaceholder, "ANTHROPIC_API_KEY=" + KeyPlaceholder, "OPENCODE_CONFIG_CONTENT={}"},
			[]ModelAPI{{"OPENAI_BASE_URL", "https://api.openai.com/v1", "Authorization", "Bearer sk-openai-1"}, {"ANTHROPIC_BASE_URL", "https://api.anthropic.com/v1", "X-Api-Key", "sk-ant-2"}}},
		{"command", []string{"SOME_TOKEN=t"}, []string{"SOME_TOKEN=t"}, nil},
	} {
		ad, err := Lookup(tt.agent)
		if err != nil {
			t.Fatal(err)
		}
		env, apis := ad.Credentials().ModelAPIs(tt.configured)
		if !slices.Equal(env, tt.env) || !slices.Equal(apis, tt.apis) {
			t.Errorf("%s %v:\n env %q, want %q\n apis %+v, want %+v", tt.agent, tt.configured, env, tt.env, apis, tt.apis)
		}
		for _, kv := range env {
			for _, a := range apis {
				if v := strings.TrimPrefix(a.Value, "Bearer "); strings.Contains(kv, v) {
					t.Errorf("%s: the sandbox's %q holds a key", tt.agent, kv)
				}
			}
		}
	}
}
