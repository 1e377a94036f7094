package httpapi

import (
	"context"
	"net/http"
	"net/url"

	"github.com/corral-dev/corral/internal/service"
)

// listSkills serves GET /api/skills.
func (s *Server) listSkills(w http.ResponseWriter, r *http.Request) error {
	skills, err := s.svc.Library.ListSkills(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"skills": skills})
	return nil
}

// getSkill serves GET /api/skills/{name}.
func (s *Server) getSkill(w http.ResponseWriter, r *http.Request) error {
	sk, err := s.svc.Library.GetSkill(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sk)
	return nil
}

// createSkill serves POST /api/skills: create_skill's arguments.
func (s *Server) createSkill(w http.ResponseWriter, r *http.Request) error {
	req, err := decodeBody[service.CreateSkillRequest](s, r)
	if err != nil {
		return err
	}
	sk, err := s.svc.Library.CreateSkill(r.Context(), req)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/api/skills/"+url.PathEscape(sk.Name))
	writeJSON(w, http.StatusCreated, sk)
	return nil
}

// ListSkills lists the skills.
func (c *Client) ListSkills(ctx context.Context) ([]service.SkillInfo, error) {
	var r struct {
		Skills []service.SkillInfo `json:"skills"`
	}
	err := c.call(ctx, http.MethodGet, "/api/skills", nil, &r)
	return r.Skills, err
}

// GetSkill returns a skill.
func (c *Client) GetSkill(ctx context.Context, name string) (service.SkillDetail, error) {
	var sk service.SkillDetail
	err := c.call(ctx, http.MethodGet, "/api/skills/"+url.PathEscape(name), nil, &sk)
	return sk, err
}

// CreateSkill creates a skill.
func (c *Client) CreateSkill(ctx context.Context, req service.CreateSkillRequest) (service.SkillDetail, error) {
	var sk service.SkillDetail
	err := c.call(ctx, http.MethodPost, "/api/skills", req, &sk)
	return sk, err
}
