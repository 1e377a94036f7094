package httpapi

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// Every JSON body the API reads refuses, before the backend sees it, text
// that is not UTF-8 (which encoding/json turned into U+FFFD) and a name
// given twice (of which encoding/json kept the last), with a 400 that says
// which field and what is wrong. The bodies are raw bytes on the wire.
func TestJSONBodiesRefuseBadUTF8AndRepeatedNames(t *testing.T) {
	spawned := false
	b := &stub{spawn: func(service.SpawnRequest) (task.Task, bool, error) {
		spawned = true
		return task.Task{ID: "task-x", Status: task.Queued}, false, nil
	}}
	_, url, _ := MustServe(t, b, "")
	routes := []struct{ path, field string }{
		{"/api/tasks", "task_description"},
		{"/api/tools/spawn_worker", "task_description"},
		{"/api/tools/write_workspace", "content"},
		{"/api/tools/read_workspace", "path"},
		{"/api/documents", "content"},
		{"/api/documents/export", "query"},
		{"/api/skills", "instructions"},
	}
	for _, rt := range routes {
		for _, c := range []struct{ name, body, want string }{
			{"invalid UTF-8", `{"` + rt.field + `":"caf` + "\xe9" + ` au lait"}`, rt.field + ": is not valid UTF-8"},
			{"UTF-8 cut short", `{"` + rt.field + `":"` + "\xe2\x82" + `"}`, rt.field + ": is not valid UTF-8"},
			{"lone surrogate", `{"` + rt.field + `":"\udc00"}`, rt.field + ": invalid JSON"},
			{"repeated name", `{"` + rt.field + `":"a","` + rt.field + `":"b"}`, rt.field + ": is given more than once"},
			{"repeated in another case", `{"` + rt.field + `":"a","` + strings.ToUpper(rt.field) + `":"b"}`, strings.ToUpper(rt.field) + ": is not a known field"},
		} {
			resp, err := http.Post(url+rt.path, "application/json", strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var eb errorBody
			if err := json.Unmarshal(body, &eb); err != nil || resp.StatusCode != http.StatusBadRequest || !strings.Contains(eb.Error, c.want) {
				t.Errorf("POST %s with %s: %d %s, want 400 saying %q", rt.path, c.name, resp.StatusCode, body, c.want)
			}
			if len(eb.Fields) != 1 || eb.Fields[0].Field != strings.SplitN(c.want, ":", 2)[0] {
				t.Errorf("POST %s with %s: fields %+v, want one naming the field", rt.path, c.name, eb.Fields)
			}
		}
	}
	if spawned {
		t.Error("a refused body reached the backend")
	}
}
