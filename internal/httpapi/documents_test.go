package httpapi

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/orchestrator"
)

// The document and skill methods of stub record what they were asked and
// answer from package-level test doubles set by each test.
var (
	searchFn      func(orchestrator.SearchRequest) (orchestrator.SearchResult, error)
	createSkillFn func(orchestrator.CreateSkillRequest) (orchestrator.SkillDetail, error)
)

func (s *stub) IngestDocument(context.Context, orchestrator.IngestRequest) (orchestrator.Document, error) {
	return orchestrator.Document{}, errUnset
}
func (s *stub) SearchDocuments(_ context.Context, r orchestrator.SearchRequest) (orchestrator.SearchResult, error) {
	if searchFn == nil {
		return orchestrator.SearchResult{}, errUnset
	}
	return searchFn(r)
}
func (s *stub) ExportNotes(context.Context, orchestrator.ExportNotesRequest) (orchestrator.ExportNotesResult, error) {
	return orchestrator.ExportNotesResult{}, errUnset
}
func (s *stub) ListSkills(context.Context) ([]orchestrator.SkillInfo, error) { return nil, errUnset }
func (s *stub) GetSkill(context.Context, string) (orchestrator.SkillDetail, error) {
	return orchestrator.SkillDetail{}, errUnset
}
func (s *stub) CreateSkill(_ context.Context, r orchestrator.CreateSkillRequest) (orchestrator.SkillDetail, error) {
	if createSkillFn == nil {
		return orchestrator.SkillDetail{}, errUnset
	}
	return createSkillFn(r)
}

// TestDocumentAndSkillRoutes checks the client and the routes agree: the
// search's query parameters arrive, and a duplicate skill comes back as the
// class the orchestrator returned (409 on the wire).
func TestDocumentAndSkillRoutes(t *testing.T) {
	var got orchestrator.SearchRequest
	searchFn = func(r orchestrator.SearchRequest) (orchestrator.SearchResult, error) {
		got = r
		return orchestrator.SearchResult{Query: r.Query, Documents: []orchestrator.DocumentHit{}}, nil
	}
	createSkillFn = func(r orchestrator.CreateSkillRequest) (orchestrator.SkillDetail, error) {
		return orchestrator.SkillDetail{}, fmt.Errorf("a skill named %q exists: %w", r.Name, errdefs.ErrAlreadyExists)
	}
	t.Cleanup(func() { searchFn, createSkillFn = nil, nil })
	c, _, _ := MustServe(t, &stub{}, "")
	ctx := context.Background()

	want := orchestrator.SearchRequest{Query: "budget & categories?", Type: "note", Limit: 7}
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

	_, err = c.CreateSkill(ctx, orchestrator.CreateSkillRequest{Name: "dup", Description: "x"})
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("duplicate skill: %v, want a conflict", err)
	}
}
