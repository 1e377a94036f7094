//go:build integration

package e2e_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/agent/agenttest"
	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

// BenchmarkClaudeFirstRequest measures the time from spawn to Claude Code's
// first model request, through the claude adapter and, beside it in the
// same server and sandbox, the same `claude -p` command run by hand as the
// command agent. The difference is the adapter's overhead.
//
//	go test -tags integration -run '^$' -bench ClaudeFirstRequest -benchtime 5x ./internal/app/
func BenchmarkClaudeFirstRequest(b *testing.B) {
	testenv.RequireBinary(b, "claude", "npm install -g @anthropic-ai/claude-code")
	ep := agenttest.MustAnthropic(b, agenttest.AnthropicOptions{Key: claudeTestKey, Addr: "127.0.0.2:0", Replies: []agenttest.Reply{{Text: "Done."}}})
	env := map[string]string{
		"ANTHROPIC_BASE_URL": ep.URL, "ANTHROPIC_API_KEY": claudeTestKey,
		// What the adapter sets by default, so both runs do the same work.
		"DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1", "DISABLE_ERROR_REPORTING": "1",
	}
	s := startServer(b, []string{}, nil, func(c *config.Config) {
		c.Egress.Mode = "allowlist"
		c.Egress.Allow = []string{ep.Addr}
		c.Agents.Claude.Env = env
		c.Agents.Command.Env = env
	})
	for _, mode := range []string{"adapter", "by-hand"} {
		b.Run(mode, func(b *testing.B) {
			var firsts []float64
			for i := 0; i < b.N; i++ {
				req := service.SpawnRequest{TaskDescription: "Say done.", Network: "allowlist", Model: "claude-sonnet-4-5", Agent: "claude"}
				if mode == "by-hand" {
					req.Agent, req.Model = "command", ""
					req.Command = []string{"claude", "-p", "--output-format", "stream-json", "--verbose", "--dangerously-skip-permissions", "--model", "claude-sonnet-4-5"}
				}
				seen := len(ep.Requests())
				start := time.Now()
				tk, _, err := s.client.Spawn(context.Background(), req)
				if err != nil {
					b.Fatal(err)
				}
				res, err := s.client.Result(context.Background(), service.ResultRequest{TaskID: tk.ID, Wait: 3 * time.Minute})
				if err != nil || res.Status != task.Success {
					b.Fatalf("%s run: %s %v %s", mode, res.Status, err, res.ErrorMessage)
				}
				for _, r := range ep.Requests()[seen:] {
					if r.Main {
						firsts = append(firsts, float64(r.At.Sub(start).Milliseconds()))
						break
					}
				}
			}
			if len(firsts) > 0 {
				slices.Sort(firsts)
				b.ReportMetric(firsts[len(firsts)/2], "ms-to-first-request")
			}
		})
	}
}
