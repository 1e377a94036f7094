package httpapi

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/service"
)

// The document and skill methods of stub record what they were asked and
// answer from package-level test doubles set by each test.
var (
	searchFn      func(service.SearchRequest) (service.SearchResult, error)
	createSkillFn func(service.CreateSkillRequest) (service.SkillDetail, error)
)

func (s *stub) IngestDocument(context.Context, service.IngestRequest) (service.Document, error) {
	return service.Document{}, errUnset
}
func (s *stub) SearchDocuments(_ context.Context, r service.SearchRequest) (service.SearchResult, error) {
	if searchFn == nil {
		return service.SearchResult{}, errUnset
	}
	return searchFn(r)
}
func (s *stub) ExportNotes(context.Context, service.ExportNotesRequest) (service.ExportNotesResult, error) {
	return service.ExportNotesResult{}, errUnset
}
func (s *stub) ListSkills(context.Context) ([]service.SkillInfo, error) { return nil, errUnset }
func (s *stub) GetSkill(context.Context, string) (service.SkillDetail, error) {
	return service.SkillDetail{}, errUnset
}
func (s *stub) CreateSkill(_ context.Context, r service.CreateSkillRequest) (service.SkillDetail, error) {
	if createSkillFn == nil {
		return service.SkillDetail{}, errUnset
	}
	return createSkillFn(r)
}

// TestDocumentAndSkillRoutes checks the client and the routes agree: the
// search's query parameters arrive, and a duplicate skill comes back as the
// class the orchestrator returned (409 on the wire).
func TestDocumentAndSkillRoutes(t *testing.T) {
	var got service.SearchRequest
	searchFn = func(r service.SearchRequest) (service.SearchResult, error) {
		got = r
		return service.SearchResult{Query: r.Query, Documents: []service.DocumentHit{}}, nil
	}
	createSkillFn = func(r service.CreateSkillRequest) (service.SkillDetail, error) {
		return service.SkillDetail{}, fmt.Errorf("a skill named %q exists: %w", r.Name, errdefs.ErrAlreadyExists)
	}
	t.Cleanup(func() { searchFn, createSkillFn = nil, nil })
	c, _, _ := MustServe(t, &stub{}, "")
	ctx := context.Background()

	want := service.SearchRequest{Query: "budget & categories?", Type: "note", Limit: 7}
	res, err := c.SearchDocuments(ctx, want)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("search request (-want +got):\n%s", diff)
	}
	if res.Query != want.Query || res.Documents == nil {
		t.Errorf("result %+v", res)
	}

	_, err = c.CreateSkill(ctx, service.CreateSkillRequest{Name: "dup", Description: "x"})
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("duplicate skill: %v, want a conflict", err)
	}
}
