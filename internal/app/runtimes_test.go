package app

import (
	"encoding/json"
	"log/slog"
	"slices"
	"testing"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
	"github.com/corral-dev/corral/internal/tools"
)

// The runtime names come from config.Runtimes: every one is either built
// by openRuntime or says why not, and spawn_worker's schema offers exactly
// them.
func TestRuntimeNamesAgree(t *testing.T) {
	cfg := config.Default()
	for _, name := range config.Runtimes {
		rt, err := openRuntime(name, cfg, t.TempDir(), t.TempDir(), hostuser.Default(), slog.New(slog.DiscardHandler))
		if rt == nil && err == nil && notBuilt[name] == "" {
			t.Errorf("runtime %s is neither built nor said to be not built", name)
		}
		if rt != nil && notBuilt[name] != "" {
			t.Errorf("runtime %s is built but said not to be", name)
		}
	}
	for name := range notBuilt {
		if !slices.Contains(config.Runtimes, name) {
			t.Errorf("notBuilt names %s, which is not a runtime", name)
		}
	}
	var schema struct {
		Properties struct {
			Runtime struct {
				Enum []string `json:"enum"`
			} `json:"runtime"`
		} `json:"properties"`
	}
	for _, tl := range tools.New(nil, tools.Limits{}).All() {
		if tl.Name == "spawn_worker" {
			if err := json.Unmarshal(tl.Schema, &schema); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !slices.Equal(schema.Properties.Runtime.Enum, config.Runtimes) {
		t.Errorf("spawn_worker offers runtimes %v, config has %v", schema.Properties.Runtime.Enum, config.Runtimes)
	}
}
