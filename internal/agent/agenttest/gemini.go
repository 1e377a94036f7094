package agenttest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// GeminiRequest is what the Gemini endpoint recorded of one request; its
// Path is e.g. /v1beta/models/gemini-2.5-pro:streamGenerateContent, its
// Model the one named in the path, Stream set for streamGenerateContent
// (rather than generateContent), and its key x-goog-api-key (or ?key=).
type GeminiRequest struct {
	Request
	// Contents is the number of turns in the request's conversation.
	Contents int
	// System is the system instruction, flattened to text.
	System string
	// LastUser is the text of the last turn (function responses included,
	// as JSON).
	LastUser string
}

// GeminiOptions configure a Gemini endpoint.
type GeminiOptions = Options[GeminiRequest]

// Gemini is a scripted Gemini API (POST /v1beta/models/M:streamGenerateContent
// with alt=sse, :generateContent and :countTokens) on loopback. Its URL is
// http://ADDR, for GOOGLE_GEMINI_BASE_URL.
type Gemini struct {
	endpoint[GeminiRequest]
}

// MustGemini starts a Gemini endpoint, stopped when tb ends.
func MustGemini(tb testing.TB, opts GeminiOptions) *Gemini {
	tb.Helper()
	g := &Gemini{}
	g.start(tb, "gemini", opts, "", g.serve)
	return g
}

// geminiBody is the part of a generateContent request the endpoint reads.
type geminiBody struct {
	Contents []struct {
		Role  string            `json:"role"`
		Parts []json.RawMessage `json:"parts"`
	} `json:"contents"`
	SystemInstruction *struct {
		Parts []json.RawMessage `json:"parts"`
	} `json:"systemInstruction"`
	Tools []json.RawMessage `json:"tools"`
}

func (g *Gemini) serve(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	i := strings.LastIndex(path, ":")
	if r.Method != http.MethodPost || i < 0 || !strings.Contains(path, "/models/") {
		w.WriteHeader(http.StatusOK)
		return
	}
	method := path[i+1:]
	model := path[strings.LastIndex(path[:i], "/")+1 : i]
	var body geminiBody
	readBody(r, &body)
	key := r.Header.Get("x-goog-api-key")
	if key == "" {
		key = r.URL.Query().Get("key")
	}
	req := GeminiRequest{
		Request:  newRequest(r, model, method == "streamGenerateContent", len(body.Tools) > 0, g.keyOK(key)),
		Contents: len(body.Contents),
	}
	if body.SystemInstruction != nil {
		req.System = geminiParts(body.SystemInstruction.Parts)
	}
	if n := len(body.Contents); n > 0 {
		req.LastUser = geminiParts(body.Contents[n-1].Parts)
	}

	status, reply, _ := g.answer(&req, &req.Request, req.Main && method != "countTokens")
	if status != 0 {
		writeGeminiError(w, status)
		return
	}
	if method == "countTokens" {
		writeJSON(w, http.StatusOK, map[string]any{"totalTokens": 100})
		return
	}
	resp := geminiResponse(model, reply)
	if !req.Stream {
		writeJSON(w, http.StatusOK, resp)
		return
	}
	// The CLI asks for alt=sse: each chunk a "data:" line.
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	b, _ := json.Marshal(resp)
	fmt.Fprintf(w, "data: %s\r\n\r\n", b)
	if fl, ok := w.(http.Flusher); ok {
		fl.Flush()
	}
}

// geminiResponse is reply as a GenerateContentResponse.
func geminiResponse(model string, reply Reply) map[string]any {
	in, out := reply.tokens()
	var parts []map[string]any
	if reply.Text != "" {
		parts = append(parts, map[string]any{"text": reply.Text})
	}
	if reply.Tool != nil {
		parts = append(parts, map[string]any{"functionCall": map[string]any{"name": reply.Tool.Name, "args": reply.Tool.input()}})
	}
	return map[string]any{
		"candidates": []any{map[string]any{
			"content":      map[string]any{"role": "model", "parts": parts},
			"finishReason": "STOP",
			"index":        0,
		}},
		"usageMetadata": map[string]any{"promptTokenCount": in, "candidatesTokenCount": out, "totalTokenCount": in + out},
		"modelVersion":  model,
	}
}

// writeGeminiError answers with status and the API's error body.
func writeGeminiError(w http.ResponseWriter, status int) {
	code, msg := "INTERNAL", "An internal error has occurred."
	switch status {
	case http.StatusUnauthorized:
		code, msg = "UNAUTHENTICATED", "API key not valid. Please pass a valid API key."
	case http.StatusForbidden:
		code, msg = "PERMISSION_DENIED", "Permission denied."
	case http.StatusTooManyRequests:
		code, msg = "RESOURCE_EXHAUSTED", "Resource has been exhausted (e.g. check quota)."
	case http.StatusServiceUnavailable:
		code, msg = "UNAVAILABLE", "The model is overloaded. Please try again later."
	}
	writeJSON(w, status, map[string]any{"error": map[string]any{"code": status, "message": msg, "status": code}})
}

// geminiParts is a turn's parts as text: text parts as they are, function
// calls and responses as their JSON.
func geminiParts(parts []json.RawMessage) string {
	var out []string
	for _, raw := range parts {
		var p struct {
			Text string `json:"text"`
		}
		if json.Unmarshal(raw, &p) == nil && p.Text != "" {
			out = append(out, p.Text)
			continue
		}
		out = append(out, string(raw))
	}
	return strings.Join(out, "\n")
}
