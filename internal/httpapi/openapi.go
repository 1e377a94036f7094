package httpapi

import (
	_ "embed"
	"net/http"
)

// OpenAPI is the API's OpenAPI 3.1 document, written by hand and kept true
// by openapi_test.go, which walks the routes the server registers against
// it and validates real answers against its schemas.
//
//go:embed openapi.json
var OpenAPI []byte

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
