package httpapi_test

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/httpapi"
)

var update = flag.Bool("update", false, "rewrite docs/http-api.md from openapi.json")

// apiDocPath is the HTTP API reference, made from the OpenAPI document.
const apiDocPath = "../../docs/http-api.md"

// docs/http-api.md is what the OpenAPI document makes of it; go generate
// ./internal/httpapi (go test -run TestHTTPAPIDoc -update) rewrites it.
func TestHTTPAPIDoc(t *testing.T) {
	got := renderAPIDoc(t)
	if *update {
		if err := os.WriteFile(apiDocPath, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(apiDocPath)
	if err != nil || !bytes.Equal(want, got) {
		t.Errorf("docs/http-api.md is not what openapi.json makes (%v): run go generate ./internal/httpapi", err)
	}
}

// The parts of the document the reference shows.
type (
	apiDoc struct {
		Info struct {
			Description string `json:"description"`
		} `json:"info"`
		Tags  []struct{ Name string }     `json:"tags"`
		Paths map[string]map[string]apiOp `json:"paths"`
		Comp  struct {
			Schemas map[string]apiSchema `json:"schemas"`
		} `json:"components"`
	}
	apiOp struct {
		OperationID string                `json:"operationId"`
		Tags        []string              `json:"tags"`
		Summary     string                `json:"summary"`
		Description string                `json:"description"`
		Security    *[]map[string]any     `json:"security"`
		Parameters  []apiParam            `json:"parameters"`
		RequestBody *apiContent           `json:"requestBody"`
		Responses   map[string]apiContent `json:"responses"`
	}
	apiParam struct {
		Name        string    `json:"name"`
		In          string    `json:"in"`
		Description string    `json:"description"`
		Schema      apiSchema `json:"schema"`
	}
	apiContent struct {
		Description string `json:"description"`
		Ref         string `json:"$ref"`
		Content     map[string]struct {
			Schema apiSchema `json:"schema"`
		} `json:"content"`
	}
	apiSchema struct {
		Ref        string               `json:"$ref"`
		Type       any                  `json:"type"`
		Format     string               `json:"format"`
		Enum       []any                `json:"enum"`
		Const      any                  `json:"const"`
		Items      *apiSchema           `json:"items"`
		OneOf      []apiSchema          `json:"oneOf"`
		Properties map[string]apiSchema `json:"properties"`
		Required   []string             `json:"required"`
		Desc       string               `json:"description"`
		Additional json.RawMessage      `json:"additionalProperties"`
	}
)

// typeOf writes a schema's type as the reference shows it: a schema's
// name links to its section.
func typeOf(s apiSchema) string {
	switch {
	case s.Ref != "":
		name := s.Ref[strings.LastIndex(s.Ref, "/")+1:]
		return fmt.Sprintf("[%s](#%s)", name, strings.ToLower(name))
	case s.Const != nil:
		return fmt.Sprintf("`%v`", s.Const)
	case len(s.OneOf) > 0:
		var alts []string
		for _, o := range s.OneOf {
			alts = append(alts, typeOf(o))
		}
		return strings.Join(alts, " or ")
	}
	var types []string
	switch t := s.Type.(type) {
	case string:
		types = []string{t}
	case []any:
		for _, x := range t {
			types = append(types, x.(string))
		}
	}
	for i, t := range types {
		switch t {
		case "array":
			if s.Items != nil {
				types[i] = "array of " + typeOf(*s.Items)
			}
		case "object":
			var add apiSchema
			if len(s.Additional) > 0 && json.Unmarshal(s.Additional, &add) == nil && (add.Type != nil || add.Ref != "") {
				types[i] = "map of " + typeOf(add)
			}
		case "string":
			if s.Format != "" {
				types[i] = "string (" + s.Format + ")"
			}
		}
	}
	out := strings.Join(types, " or ")
	if out == "" {
		out = "any"
	}
	if len(s.Enum) > 0 {
		var vals []string
		for _, v := range s.Enum {
			vals = append(vals, fmt.Sprintf("`%v`", v))
		}
		out += ": " + strings.Join(vals, ", ")
	}
	return out
}

func renderAPIDoc(t *testing.T) []byte {
	var d apiDoc
	if err := json.Unmarshal(httpapi.OpenAPI, &d); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p("# HTTP API reference\n\n")
	p("<!-- Made from internal/httpapi/openapi.json by `go generate ./internal/httpapi`: edit the document, not this file. -->\n\n")
	p("%s\n\n", d.Info.Description)
	p("The machine-readable document is served at `GET /api/openapi.json` (no token needed). ")
	p("Typed clients made from it: Python in [clients/python](../clients/python/README.md), TypeScript in [clients/typescript](../clients/typescript/README.md).\n\n")
	p("## Operations\n\n")
	type entry struct {
		method, path string
		op           apiOp
	}
	byTag := map[string][]entry{}
	for path, ops := range d.Paths {
		for m, op := range ops {
			byTag[op.Tags[0]] = append(byTag[op.Tags[0]], entry{strings.ToUpper(m), path, op})
		}
	}
	for _, tag := range d.Tags {
		es := byTag[tag.Name]
		sort.Slice(es, func(i, j int) bool {
			if es[i].path != es[j].path {
				return es[i].path < es[j].path
			}
			return es[i].method < es[j].method
		})
		p("### %s\n\n", tag.Name)
		for _, e := range es {
			p("#### `%s %s`\n\n%s", e.method, e.path, e.op.Summary)
			if e.op.Description != "" {
				p(" %s", e.op.Description)
			}
			p("\n\n")
			switch {
			case e.op.Security == nil:
			case len(*e.op.Security) == 0:
				p("No token needed.\n\n")
			default:
				p("The API token or the session's own token.\n\n")
			}
			for _, prm := range e.op.Parameters {
				if prm.In == "path" {
					continue
				}
				p("- `%s` (query, %s)", prm.Name, typeOf(prm.Schema))
				if prm.Description != "" {
					p(": %s", prm.Description)
				}
				p("\n")
			}
			if len(e.op.Parameters) > 0 && slices.ContainsFunc(e.op.Parameters, func(p apiParam) bool { return p.In != "path" }) {
				p("\n")
			}
			if rb := e.op.RequestBody; rb != nil {
				for _, mt := range sortedKeys(rb.Content) {
					p("Body (`%s`): %s\n\n", mt, typeOf(rb.Content[mt].Schema))
				}
			}
			for _, code := range sortedKeys(e.op.Responses) {
				if code == "default" {
					continue
				}
				r := e.op.Responses[code]
				p("- %s: %s", code, r.Description)
				for _, mt := range sortedKeys(r.Content) {
					p(" `%s` %s.", mt, typeOf(r.Content[mt].Schema))
				}
				p("\n")
			}
			p("- otherwise: an [Error](#error).\n\n")
		}
	}
	p("## Schemas\n\n")
	p("A field marked required is always in an answer (it may be null where its type says so); the others are left out when empty.\n\n")
	for _, name := range sortedKeys(d.Comp.Schemas) {
		s := d.Comp.Schemas[name]
		p("### %s\n\n", name)
		if s.Desc != "" {
			p("%s\n\n", s.Desc)
		}
		if s.Properties == nil {
			p("%s\n\n", typeOf(s))
			continue
		}
		p("| Field | Type | Required | Description |\n|---|---|---|---|\n")
		for _, f := range sortedKeys(s.Properties) {
			req := ""
			if slices.Contains(s.Required, f) {
				req = "yes"
			}
			desc := strings.ReplaceAll(s.Properties[f].Desc, "|", "\\|")
			p("| `%s` | %s | %s | %s |\n", f, typeOf(s.Properties[f]), req, desc)
		}
		p("\n")
	}
	return bytes.TrimRight(b.Bytes(), "\n")
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
