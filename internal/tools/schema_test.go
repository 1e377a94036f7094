package tools

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/service"
)

// The schemas are written for people and models to read, so they are
// written by hand; this ties each one to the Go type its arguments decode
// into: the same field names, nested objects included, and the same
// required fields as the type's non-omitempty ones.
func TestSchemasMatchRequestTypes(t *testing.T) {
	types := map[string]any{
		"spawn_worker":                     service.SpawnRequest{},
		"list_worker_tasks":                service.ListRequest{},
		"create_attachment_from_workspace": service.CreateAttachmentRequest{},
		"ingest_from_workspace":            service.IngestRequest{},
		"export_notes_to_workspace":        service.ExportNotesRequest{},
		"search_documents":                 service.SearchRequest{},
		"create_skill":                     service.CreateSkillRequest{},
		"code_execute":                     service.ExecRequest{},
		"workspace_exec":                   service.SessionExecRequest{},
		"suspend_session":                  service.SessionRequest{},
		"resume_session":                   service.SessionRequest{},
		"fork_session":                     service.ForkSessionRequest{},
		"spawn_workspace_task":             service.WorkspaceTaskRequest{},
	}
	cat := New(service.Set{}, Limits{})
	for name, v := range types {
		i, ok := cat.index[name]
		if !ok {
			t.Errorf("%s: no such tool", name)
			continue
		}
		var s schema
		if err := json.Unmarshal(cat.tools[i].Schema, &s); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		compareSchema(t, name, s, reflect.TypeOf(v), refused[name])
	}
}

// refused are fields of a request type a tool refuses by name, so they are
// rightly missing from its schema.
var refused = map[string][]string{
	"ingest_from_workspace": {"content"}, // a note is POST /api/documents
}

type schema struct {
	Type       string            `json:"type"`
	Properties map[string]schema `json:"properties"`
	Items      *schema           `json:"items"`
}

func compareSchema(t *testing.T, where string, s schema, typ reflect.Type, refused []string) {
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	if typ.Kind() != reflect.Struct || s.Type != "object" || s.Properties == nil {
		return
	}
	fields := map[string]reflect.Type{}
	for f := range typ.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" || slices.Contains(refused, name) {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = f.Type
	}
	var missing, extra []string
	for name, ft := range fields {
		ps, ok := s.Properties[name]
		if !ok {
			missing = append(missing, name)
			continue
		}
		compareSchema(t, where+"."+name, ps, ft, nil)
	}
	for name := range s.Properties {
		if _, ok := fields[name]; !ok {
			extra = append(extra, name)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	if len(missing) > 0 {
		t.Errorf("%s: the type's fields %v are not in the schema", where, missing)
	}
	if len(extra) > 0 {
		t.Errorf("%s: the schema's properties %v are not fields of %s", where, extra, typ)
	}
}

// spawn_worker's schema states the server's timeouts: the seed's 30 and
// 120 by default, the configured ones otherwise.
func TestSpawnSchemaStatesTheTimeouts(t *testing.T) {
	for _, c := range []struct {
		lim               Limits
		deflt, maxMinutes int
	}{{Limits{}, 30, 120}, {Limits{DefaultTimeoutMinutes: 45, MaxTimeoutMinutes: 240}, 45, 240}} {
		cat := New(service.Set{}, c.lim)
		var s struct {
			Properties struct {
				Timeout struct {
					Default int `json:"default"`
					Maximum int `json:"maximum"`
				} `json:"timeout_minutes"`
			} `json:"properties"`
		}
		if err := json.Unmarshal(cat.tools[cat.index["spawn_worker"]].Schema, &s); err != nil {
			t.Fatal(err)
		}
		if got := s.Properties.Timeout; got.Default != c.deflt || got.Maximum != c.maxMinutes {
			t.Errorf("%+v: default %d maximum %d, want %d %d", c.lim, got.Default, got.Maximum, c.deflt, c.maxMinutes)
		}
	}
}

func TestEveryToolHasAnEffect(t *testing.T) {
	for _, tool := range New(service.Set{}, Limits{}).All() {
		if tool.Effect != Reads && tool.Effect != Writes && tool.Effect != Runs {
			t.Errorf("%s: effect %q, want reads, writes or runs", tool.Name, tool.Effect)
		}
	}
}
