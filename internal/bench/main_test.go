//go:build integration

package bench_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/corral-dev/corral/internal/testenv"
)

// corralBin is the corral binary the bench's sandboxes run as the worker.
var corralBin string

func TestMain(m *testing.M) {
	bin, remove, err := testenv.BuildCorral()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	corralBin = bin
	code := m.Run()
	remove()
	os.Exit(code)
}
