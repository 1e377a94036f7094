package httpapi

import (
	"bytes"
	"encoding/json"
	"sync"

	"github.com/corral-dev/corral/internal/service"
)

// keepEnded is how many ended tasks' results endedResults keeps encoded:
// enough for the tasks ending at about the same time, whose long polls
// are answered together.
const keepEnded = 64

// endedResults keeps the encoded answer to GET /api/tasks/{id}/result for
// the last tasks to end. A task's end wakes every long poll of it at once;
// they then share one encoding of its result, the same bytes for each,
// instead of encoding the task 500 times over while the others wait for
// a CPU (BenchmarkLongPollWake). An ended task's result changes only with
// a later event (a failed destroy), which gives it another version and so
// another entry.
type endedResults struct {
	mu    sync.Mutex
	byID  map[string]*encodedResult
	order []string // ids, oldest first
}

// encodedResult is one ended task's result at one version, encoded once.
type encodedResult struct {
	version int64
	once    sync.Once
	body    []byte
}

// encode returns res, a result with Done and no file contents, as
// writeJSON would write it.
func (e *endedResults) encode(res service.Result) []byte {
	e.mu.Lock()
	if e.byID == nil {
		e.byID = map[string]*encodedResult{}
	}
	r := e.byID[res.ID]
	if r == nil || r.version != res.Version {
		if r == nil {
			e.order = append(e.order, res.ID)
			if len(e.order) > keepEnded {
				delete(e.byID, e.order[0])
				e.order = e.order[1:]
			}
		}
		r = &encodedResult{version: res.Version}
		e.byID[res.ID] = r
	}
	e.mu.Unlock()
	r.once.Do(func() {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		enc.Encode(res)
		r.body = b.Bytes()
	})
	return r.body
}
