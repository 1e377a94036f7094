package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/corral-dev/corral/internal/httpapi"
	"github.com/corral-dev/corral/internal/httpapi/openapitest"
	"github.com/corral-dev/corral/internal/testenv"
)

// notInDocument are the routes the OpenAPI document leaves out, each for
// its reason.
var notInDocument = map[string]string{
	"/mcp":  "the MCP streamable HTTP transport, described by the MCP specification",
	"/api/": "the catch-all that answers an unknown API route with a 404",
	"/":     "the web UI's pages and assets",
	// A sandbox's own: on the unix socket, and on the listener for pods.
	"POST /api/sessions/{id}/agent": "a session's exec agent's connection from inside its sandbox, which it takes over",
	"GET /api/warm/{id}/start":      "a warm pod's worker waiting for its task, with that pod's own token",
}

// Every route the server registers is in the OpenAPI document, and every
// operation of the document is a route the server registers: the document
// is the API, not a wish list. The unix socket's routes (for sandboxes) are
// routes of the API too.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	doc := openapitest.Load(t)
	api, socket := httpapi.RoutePatterns()
	var registered []string
	for _, p := range append(api, socket...) {
		if _, ok := notInDocument[p]; ok {
			continue
		}
		// A {name...} wildcard is a {name} parameter that may hold
		// slashes: the document writes it as {name}.
		if p = strings.ReplaceAll(p, "...}", "}"); !slices.Contains(registered, p) {
			registered = append(registered, p)
		}
	}
	documented := doc.Operations()
	for _, r := range registered {
		if !slices.Contains(documented, r) {
			t.Errorf("route %s is registered but not in openapi.json", r)
		}
	}
	for _, o := range documented {
		if !slices.Contains(registered, o) {
			t.Errorf("openapi.json has %s, which the server does not register", o)
		}
	}
	if len(registered) < 40 {
		t.Errorf("only %d routes found: %v", len(registered), registered)
	}
}

// The document is valid OpenAPI 3.1 (kin-openapi's validation: path
// parameters match the templates, responses and references are whole),
// every schema compiles as JSON Schema 2020-12, and every operation has an
// id of its own, which the clients and docs/http-api.md name it by.
func TestOpenAPIDocumentIsWhole(t *testing.T) {
	loaded, err := openapi3.NewLoader().LoadFromData(httpapi.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	if !loaded.IsOpenAPI31OrLater() {
		t.Errorf("openapi %q, want 3.1", loaded.OpenAPI)
	}
	if err := loaded.Validate(context.Background()); err != nil {
		t.Errorf("openapi.json is not valid OpenAPI: %v", err)
	}
	var d struct {
		OpenAPI    string `json:"openapi"`
		Components struct {
			Schemas map[string]json.RawMessage `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(httpapi.OpenAPI, &d); err != nil {
		t.Fatal(err)
	}
	if d.OpenAPI != "3.1.0" {
		t.Errorf("openapi %q, want 3.1.0", d.OpenAPI)
	}
	doc := openapitest.Load(t)
	for name := range d.Components.Schemas {
		doc.Schema(t, "/components/schemas/"+name)
	}
	ids := map[string]string{}
	for path, ops := range doc.Paths {
		for m, op := range ops {
			if op.OperationID == "" {
				t.Errorf("%s %s has no operationId", m, path)
			}
			if other, ok := ids[op.OperationID]; ok {
				t.Errorf("operationId %s is both %s and %s %s", op.OperationID, other, m, path)
			}
			ids[op.OperationID] = m + " " + path
			if _, ok := op.Responses["default"]; !ok {
				t.Errorf("%s %s has no default (error) response", m, path)
			}
		}
	}
}

// GET /api/openapi.json serves the document without a token.
func TestOpenAPIServed(t *testing.T) {
	hs := httptest.NewServer(httpapi.NewTestHandler("secret"))
	defer hs.Close()
	resp, err := http.Get(hs.URL + "/api/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]any
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" || json.NewDecoder(resp.Body).Decode(&v) != nil || v["openapi"] != "3.1.0" {
		t.Errorf("GET /api/openapi.json without a token: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}

// The clients' types (clients/python/corral_client/types.py and
// clients/typescript/src/types.ts) are what clients/gen_types.py makes of
// the document now.
func TestClientTypesMatchTheDocument(t *testing.T) {
	testenv.RequireBinary(t, "python3", "apt-get install -y python3")
	out, err := exec.Command("python3", "../../clients/gen_types.py", "--check").CombinedOutput()
	if err != nil {
		t.Errorf("%v: %s", err, out)
	}
}

// The document's Error.code lists every code an error answer carries, and
// no other.
func TestOpenAPIErrorCodes(t *testing.T) {
	var d struct {
		Components struct {
			Schemas struct {
				Error struct {
					Properties struct {
						Code struct {
							Enum []string `json:"enum"`
						} `json:"code"`
					} `json:"properties"`
				} `json:"Error"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(httpapi.OpenAPI, &d); err != nil {
		t.Fatal(err)
	}
	got := d.Components.Schemas.Error.Properties.Code.Enum
	want := httpapi.ErrorCodes()
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("Error.code's enum is %v, the server's codes %v", got, want)
	}
}
