package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// helperArgsEnv, when set, makes the test binary act as `corral worker
// run-task` with these (JSON-encoded) arguments, so tests can send a real
// SIGTERM to a real worker process.
const helperArgsEnv = "WORKER_TEST_HELPER_ARGS"

func TestMain(m *testing.M) {
	if name := os.Getenv(hideHelperEnv); name != "" {
		hideHelper(name)
	}
	if mode := os.Getenv(threadsHelperEnv); mode != "" {
		threadsHelper(mode)
	}
	if raw := os.Getenv(helperArgsEnv); raw != "" {
		var args []string
		if err := json.Unmarshal([]byte(raw), &args); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(ExitUsage)
		}
		opts, err := ParseArgs(args, os.Environ())
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(ExitUsage)
		}
		os.Exit(Run(context.Background(), opts, slog.New(slog.NewTextHandler(os.Stderr, nil))))
	}
	goleak.VerifyTestMain(m)
}
