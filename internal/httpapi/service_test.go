package httpapi

import (
	"testing"

	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/service/servicetest"
)

// The orchestrator in process and the HTTP client over the API in front
// of it answer the service contract alike.
func TestServiceContract(t *testing.T) {
	servicetest.Run(t, map[string]func(*testing.T) service.Service{
		"orchestrator": func(t *testing.T) service.Service {
			return servicetest.NewOrchestrator(t, nil).Orch
		},
		"http": func(t *testing.T) service.Service {
			o := servicetest.NewOrchestrator(t, nil).Orch
			hs := serveAt(t, "127.0.0.1:0", orchBackend{o}, Options{})
			return NewClient(hs.URL, "")
		},
	})
}
