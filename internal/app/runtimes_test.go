package app

import (
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"testing"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/rtkind"
	"github.com/corral-dev/corral/internal/sandbox/hostuser"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/tools"
)

// The runtime names come from rtkind.Names(): every one is either built
// by openRuntime or says why not (kubernetes, with no cluster or server
// URL configured), and spawn_worker's schema offers exactly them.
func TestRuntimeNamesAgree(t *testing.T) {
	t.Setenv("KUBECONFIG", "")
	cfg := config.Default()
	for _, name := range rtkind.Names() {
		rt, err := openRuntime(name, cfg, t.TempDir(), t.TempDir(), hostuser.Default(), nil, slog.New(slog.DiscardHandler))
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
