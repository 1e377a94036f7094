package postgres

import (
	"testing"

	"github.com/corral-dev/corral/internal/eventstore/storetest"
)

func TestCheckpoints(t *testing.T) {
	storetest.RunCheckpoints(t, func(t *testing.T) storetest.CheckpointStore { return mustOpen(t, mustDB(t)) })
}
