package session

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
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
func (m *Manager) History(ctx context.Context, req service.SessionHistoryRequest) (service.SessionHistory, error) {
	limit := req.Limit
	switch {
	case limit == 0:
		limit = service.SessionHistoryLimit
	case limit < 1 || limit > service.SessionHistoryMaxLimit:
		return service.SessionHistory{}, errdefs.Field("limit", fmt.Sprintf("must be a number from 1 to %d", service.SessionHistoryMaxLimit))
	}
	if req.Before < 0 {
		return service.SessionHistory{}, errdefs.Field("before", "must be a seq from an earlier page (a whole number above 0)")
	}
	if _, err := m.Get(ctx, req.ID); err != nil {
		return service.SessionHistory{}, err
	}
	evs, err := m.opts.Store.ReadStream(ctx, StreamID(req.ID), 0)
	if err != nil {
		return service.SessionHistory{}, fmt.Errorf("read session %s's events: %w", req.ID, err)
	}
	// The page: the latest limit events of the history before Before,
	// counted from the end, so only they are decoded.
	end := len(evs)
	if req.Before > 0 {
		end = sort.Search(len(evs), func(i int) bool { return evs[i].StreamVersion >= req.Before })
	}
	var page []eventstore.Event
	start := end
	for start > 0 && len(page) < limit {
		start--
		if _, ok := lifecycle[evs[start].Type]; ok {
			page = append(page, evs[start])
		}
	}
	slices.Reverse(page)
	out := service.SessionHistory{Events: make([]service.SessionEvent, 0, len(page))}
	if len(page) == limit && slices.ContainsFunc(evs[:start], func(e eventstore.Event) bool { _, ok := lifecycle[e.Type]; return ok }) {
		out.Before = page[0].StreamVersion
	}
	for _, e := range page {
		keep := lifecycle[e.Type]
		var all map[string]any
		json.Unmarshal(e.Data, &all)
		detail := map[string]any{}
		for _, k := range keep {
			if v, ok := all[k]; ok {
				detail[k] = v
			}
		}
		out.Events = append(out.Events, service.SessionEvent{Seq: e.StreamVersion, Type: e.Type, At: e.RecordedAt, Detail: detail})
	}
	return out, nil
}
