package httpapi

import (
	_ "embed"
	"net/http"
)

// OpenAPI is the API's OpenAPI 3.1 document, written by hand and kept true
// by openapi_test.go, which walks the routes the server registers against
// it, and by internal/e2e's TestOpenAPIResponses, which validates a real
// server's answers against its schemas. What is made from it (the clients'
// types and docs/http-api.md) is remade by go generate, and tests fail
// while it is stale.
//
//go:embed openapi.json
var OpenAPI []byte

//go:generate python3 ../../clients/gen_types.py
//go:generate go test -run TestHTTPAPIDoc -update .

// openAPI serves GET /api/openapi.json. It needs no token: the document
// describes the API, holds nothing of the server's, and a client or tool
// reads it before it has a token (the Host and Origin checks apply as
// everywhere).
func (s *Server) openAPI(w http.ResponseWriter, r *http.Request) error {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-cache")
	_, err := w.Write(OpenAPI)
	return err
}
