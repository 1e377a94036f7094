package session

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/corral-dev/corral/internal/service"
)

// lifecycle are the events History shows, and the fields of each it
// keeps: the session's own changes, and the commands run in it with how
// each ended (not their output, which GET .../execs/{exec_id} reads).
var lifecycle = map[string][]string{
	EventExecStart:      {"exec_id", "command"},
	EventExecEnd:        {"exec_id", "exit_code", "duration_ms", "error", "reason"},
	EventCreated:        {"runtime", "image", "network", "workspace", "forked_from"},
	EventSuspended:      {"memory_kept", "execs_ended", "note", "seconds"},
	EventResumed:        {"memory_kept", "replica", "seconds"},
	EventForked:         {"forks", "files", "bytes", "skipped_total", "memory_kept", "note", "seconds"},
	EventAdopted:        {"replica", "from"},
	EventNetworkChanged: {"network", "allow"},
	EventEnded:          {"reason", "error"},
}

// History implements service.Sessions.
func (m *Manager) History(ctx context.Context, id string) ([]service.SessionEvent, error) {
	if _, err := m.Get(ctx, id); err != nil {
		return nil, err
	}
	evs, err := m.opts.Store.ReadStream(ctx, StreamID(id), 0)
	if err != nil {
		return nil, fmt.Errorf("read session %s's events: %w", id, err)
	}
	out := []service.SessionEvent{}
	for _, e := range evs {
		keep, ok := lifecycle[e.Type]
		if !ok {
			continue
		}
		var all map[string]any
		json.Unmarshal(e.Data, &all)
		detail := map[string]any{}
		for _, k := range keep {
			if v, ok := all[k]; ok {
				detail[k] = v
			}
		}
		out = append(out, service.SessionEvent{Type: e.Type, At: e.RecordedAt, Detail: detail})
	}
	return out, nil
}
