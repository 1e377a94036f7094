package httpapi

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
)

// ingestDocument serves POST /api/documents: ingest_from_workspace's
// arguments (source_path), or a note's content.
func (s *Server) ingestDocument(w http.ResponseWriter, r *http.Request) error {
	req, err := decodeBody[service.IngestRequest](s, r)
	if err != nil {
		return err
	}
	d, err := s.svc.Library.IngestDocument(r.Context(), req)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/api/documents?q="+url.QueryEscape(d.Title))
	writeJSON(w, http.StatusCreated, d)
	return nil
}

// searchDocuments serves GET /api/documents?q=&type=&limit=.
func (s *Server) searchDocuments(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	req := service.SearchRequest{Query: q.Get("q"), Type: q.Get("type")}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return errdefs.Field("limit", "must be a number between 1 and 100")
		}
		req.Limit = n
	}
	res, err := s.svc.Library.SearchDocuments(r.Context(), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// exportNotes serves POST /api/documents/export:
// export_notes_to_workspace's arguments.
func (s *Server) exportNotes(w http.ResponseWriter, r *http.Request) error {
	req, err := decodeBody[service.ExportNotesRequest](s, r)
	if err != nil {
		return err
	}
	res, err := s.svc.Library.ExportNotes(r.Context(), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// IngestDocument ingests a workspace file or pushes a note.
func (c *Client) IngestDocument(ctx context.Context, req service.IngestRequest) (service.Document, error) {
	var d service.Document
	err := c.call(ctx, http.MethodPost, "/api/documents", req, &d)
	return d, err
}

// SearchDocuments searches the document index.
func (c *Client) SearchDocuments(ctx context.Context, req service.SearchRequest) (service.SearchResult, error) {
	q := url.Values{"q": {req.Query}}
	if req.Type != "" {
		q.Set("type", req.Type)
	}
	if req.Limit != 0 {
		q.Set("limit", strconv.Itoa(req.Limit))
	}
	var res service.SearchResult
	err := c.call(ctx, http.MethodGet, "/api/documents?"+q.Encode(), nil, &res)
	return res, err
}

// ExportNotes writes matching notes under shared/.
func (c *Client) ExportNotes(ctx context.Context, req service.ExportNotesRequest) (service.ExportNotesResult, error) {
	var res service.ExportNotesResult
	err := c.call(ctx, http.MethodPost, "/api/documents/export", req, &res)
	return res, err
}
