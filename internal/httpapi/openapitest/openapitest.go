// Package openapitest checks real answers of the API against the schemas
// of its OpenAPI document (httpapi.OpenAPI), for the tests that keep the
// document true.
package openapitest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/corral-dev/corral/internal/httpapi"
)

// docURL names the document for the schema compiler, which resolves the
// schemas' $refs within it.
const docURL = "file:///openapi.json"

// Doc is the OpenAPI document, parsed, with a compiler of its schemas.
type Doc struct {
	Paths      map[string]map[string]Operation `json:"paths"`
	Components struct {
		Responses map[string]Response `json:"responses"`
	} `json:"components"`

	compiler *jsonschema.Compiler
	cache    map[string]*jsonschema.Schema
}

// Operation is an operation's responses by status ("200", "default").
type Operation struct {
	OperationID string              `json:"operationId"`
	Responses   map[string]Response `json:"responses"`
}

// Response is a response's schemas by media type, or a reference to one
// of the document's components.responses.
type Response struct {
	Ref     string `json:"$ref"`
	Content map[string]struct {
		Schema json.RawMessage `json:"schema"`
	} `json:"content"`
}

// Load parses the document and readies its schemas.
func Load(tb testing.TB) *Doc {
	tb.Helper()
	var d Doc
	if err := json.Unmarshal(httpapi.OpenAPI, &d); err != nil {
		tb.Fatalf("openapi.json: %v", err)
	}
	raw, err := jsonschema.UnmarshalJSON(bytes.NewReader(httpapi.OpenAPI))
	if err != nil {
		tb.Fatalf("openapi.json: %v", err)
	}
	d.compiler = jsonschema.NewCompiler()
	d.compiler.DefaultDraft(jsonschema.Draft2020)
	d.compiler.AssertFormat()
	if err := d.compiler.AddResource(docURL, raw); err != nil {
		tb.Fatalf("openapi.json: %v", err)
	}
	d.cache = map[string]*jsonschema.Schema{}
	return &d
}

// Schema compiles the schema at JSON pointer ptr of the document.
func (d *Doc) Schema(tb testing.TB, ptr string) *jsonschema.Schema {
	tb.Helper()
	if s, ok := d.cache[ptr]; ok {
		return s
	}
	s, err := d.compiler.Compile(docURL + "#" + ptr)
	if err != nil {
		tb.Fatalf("schema %s: %v", ptr, err)
	}
	d.cache[ptr] = s
	return s
}

// Check validates an answer to method on the path template path (as the
// document writes it: /api/tasks/{id}) against the document: its status
// must be documented (or the default, which is the error body), and its
// body valid against the schema of its media type. An NDJSON body is
// checked line by line; a body of a media type whose schema is a plain
// string (text, bytes, event streams) is not read.
func (d *Doc) Check(tb testing.TB, method, path string, resp *http.Response, body []byte) {
	tb.Helper()
	ops, ok := d.Paths[path]
	if !ok {
		tb.Errorf("%s %s: the path is not in the document", method, path)
		return
	}
	op, ok := ops[strings.ToLower(method)]
	if !ok {
		tb.Errorf("%s %s: the method is not in the document", method, path)
		return
	}
	code := strconv.Itoa(resp.StatusCode)
	ptr := "/paths/" + escape(path) + "/" + strings.ToLower(method) + "/responses/" + code
	r, ok := op.Responses[code]
	if !ok {
		if resp.StatusCode < 400 {
			tb.Errorf("%s %s: status %d is not documented", method, path, resp.StatusCode)
			return
		}
		r, ptr = op.Responses["default"], strings.TrimSuffix(ptr, code)+"default"
	}
	if name, ok := strings.CutPrefix(r.Ref, "#/components/responses/"); ok {
		r, ptr = d.Components.Responses[name], "/components/responses/"+escape(name)
	}
	// The most specific media type range the document has for the
	// answer's type.
	typ, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	major, _, _ := strings.Cut(typ, "/")
	var mt string
	for _, rng := range []string{typ, major + "/*", "*/*"} {
		if _, ok := r.Content[rng]; ok {
			mt = rng
			break
		}
	}
	c, ok := r.Content[mt]
	if !ok {
		tb.Errorf("%s %s: answer %d of type %q is not documented (documented: %v)", method, path, resp.StatusCode, typ, keys(r.Content))
		return
	}
	var plain struct {
		Type string `json:"type"`
	}
	json.Unmarshal(c.Schema, &plain)
	if plain.Type == "string" {
		return
	}
	s := d.Schema(tb, ptr+"/content/"+escape(mt)+"/schema")
	values := [][]byte{body}
	if mt == "application/x-ndjson" {
		values = nil
		sc := bufio.NewScanner(bytes.NewReader(body))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			values = append(values, bytes.Clone(sc.Bytes()))
		}
	}
	for _, v := range values {
		inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(v))
		if err != nil {
			tb.Errorf("%s %s: answer %d is not JSON: %v: %.300s", method, path, resp.StatusCode, err, v)
			continue
		}
		if err := s.Validate(inst); err != nil {
			tb.Errorf("%s %s: answer %d does not match the document: %v\nbody: %.2000s", method, path, resp.StatusCode, err, v)
		}
	}
}

// escape is a JSON pointer's token of s.
func escape(s string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(s)
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// Operations lists the document's operations as route patterns
// ("GET /api/tasks/{id}").
func (d *Doc) Operations() []string {
	var out []string
	for p, ops := range d.Paths {
		for m := range ops {
			out = append(out, fmt.Sprintf("%s %s", strings.ToUpper(m), p))
		}
	}
	return out
}
