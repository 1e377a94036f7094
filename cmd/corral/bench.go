package main

import (
	"context"
	"fmt"
	"io"

	"github.com/corral-dev/corral/internal/errdefs"
)

func cmdBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return fmt.Errorf("bench: %w", errdefs.ErrNotImplemented)
}
