//go:build integration

package bench_test

import (
	"testing"

	"github.com/corral-dev/corral/internal/testenv"
)

// corralBin is the corral binary the bench's sandboxes run as the worker.
var corralBin string

func TestMain(m *testing.M) { testenv.MainWithCorral(m, &corralBin) }
