package strictjson

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
)

func TestDecodeAccepts(t *testing.T) {
	in := `{"task_description":"naïve ✓ \u00e9 \ud83d\ude00","timeout_minutes":5,"resources":{"memory_limit":"1Gi"},
		"labels":{"a":"1","b":"2"},"context_files":["x","y"]}`
	var got service.SpawnRequest
	if err := Decode(json.RawMessage(in), &got); err != nil {
		t.Fatal(err)
	}
	want := service.SpawnRequest{TaskDescription: "naïve ✓ é 😀", TimeoutMinutes: new(5),
		Resources: &service.ResourceRequest{MemoryLimit: "1Gi"}, Labels: map[string]string{"a": "1", "b": "2"},
		ContextFiles: []string{"x", "y"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("decoded (-want +got):\n%s", diff)
	}
	var ing service.IngestRequest
	if err := Decode(json.RawMessage(`{"source_path":"a","title":"t","metadata":{"tags":["x"],"n":1}}`), &ing); err != nil {
		t.Errorf("metadata object: %v", err)
	} else if string(ing.Metadata) != `{"tags":["x"],"n":1}` {
		t.Errorf("metadata = %s", ing.Metadata)
	}
}

// Bad JSON is refused with ErrInvalidArgument and a message that names the
// problem and, where there is one, the field; nothing is taken silently.
func TestDecodeRefuses(t *testing.T) {
	for _, c := range []struct {
		name, in string
		field    string // "" when the problem is not one field's
		message  string
	}{
		// encoding/json rewrote these to U+FFFD.
		{"invalid UTF-8", "{\"task_description\":\"caf\xe9\"}", "task_description", "is not valid UTF-8 (at byte 24)"},
		{"truncated UTF-8", "{\"task_description\":\"a\xe2\x82\"}", "task_description", "is not valid UTF-8"},
		{"UTF-8 in a nested value", "{\"task_description\":\"x\",\"labels\":{\"k\":\"\xff\"}}", "labels.k", "is not valid UTF-8"},
		{"invalid UTF-8 in a name", "{\"task_\xffdescription\":\"x\"}", "", "the JSON is not valid UTF-8 (at byte 7)"},
		{"lone surrogate escape", `{"task_description":"a\ud800b"}`, "task_description", "surrogate"},
		// encoding/json kept the last of these.
		{"duplicate name", `{"task_description":"a","task_description":"b"}`, "task_description", "is given more than once"},
		{"duplicate through an escape", `{"task_description":"a","task_descriptio\u006e":"b"}`, "task_description", "is given more than once"},
		{"duplicate nested name", `{"task_description":"a","labels":{"k":"1","k":"2"}}`, "labels.k", "is given more than once"},
		{"duplicate in a nested object", `{"task_description":"a","resources":{"cpu_limit":"1","cpu_limit":"2"}}`, "resources.cpu_limit", "is given more than once"},
		// encoding/json matched these to task_description, case aside.
		{"name in another case", `{"Task_Description":"a"}`, "Task_Description", "is not a known field"},
		{"two cases of one name", `{"task_description":"a","TASK_DESCRIPTION":"b"}`, "TASK_DESCRIPTION", "is not a known field"},
		{"unknown field", `{"task_description":"x","comand":["true"]}`, "comand", "is not a known field"},
		{"unknown nested field", `{"task_description":"x","resources":{"disk":"1G"}}`, "resources.disk", "is not a known field"},
		{"wrong type", `{"task_description":"x","timeout_minutes":"ten"}`, "timeout_minutes", "must be a whole number in range, not a string"},
		{"fraction", `{"task_description":"x","timeout_minutes":1.5}`, "timeout_minutes", "must be a whole number in range, not 1.5"},
		{"wrong element type", `{"task_description":"x","context_files":["a",2]}`, "context_files[1]", "must be a string, not a number"},
		{"not an object", `["x"]`, "", "the JSON must be an object, not an array"},
		{"malformed", `{"task_description":`, "task_description", "invalid JSON at byte 20: unexpected EOF"},
		{"malformed object", `{"task_description":"x",}`, "", "invalid JSON at byte 23"},
		{"empty", ``, "", "invalid JSON at byte 0: unexpected EOF"},
		{"trailing data", `{"task_description":"x"} {"task_description":"y"}`, "", "invalid JSON at byte 25"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var req service.SpawnRequest
			err := Decode(json.RawMessage(c.in), &req)
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Decode(%q) = %v, want ErrInvalidArgument", c.in, err)
			}
			var fe *errdefs.FieldError
			switch {
			case c.field == "" && errors.As(err, &fe):
				t.Errorf("Decode(%q) = %v, a field error; want one about the whole JSON", c.in, err)
			case c.field != "" && (!errors.As(err, &fe) || fe.Field != c.field):
				t.Errorf("Decode(%q) = %v, want an error of field %q", c.in, err, c.field)
			}
			if msg := errdefs.Message(err); !strings.Contains(msg, c.message) {
				t.Errorf("Decode(%q): message %q, want it to contain %q", c.in, msg, c.message)
			}
		})
	}
	// A field that keeps its JSON as it came is checked all the same.
	var ing service.IngestRequest
	for _, in := range []string{`{"title":"t","metadata":{"k":1,"k":2}}`, "{\"title\":\"t\",\"metadata\":{\"k\":\"\xff\"}}"} {
		var fe *errdefs.FieldError
		if err := Decode(json.RawMessage(in), &ing); !errors.As(err, &fe) || fe.Field != "metadata.k" {
			t.Errorf("Decode(%q) = %v, want an error of field metadata.k", in, err)
		}
	}
}
