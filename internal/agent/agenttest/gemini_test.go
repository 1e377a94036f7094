package agenttest

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// scriptPost sends body to url with key in header and returns the status and
// body.
func scriptPost(t *testing.T, url, key, body string, header string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(header, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestGeminiScript(t *testing.T) {
	g := MustGemini(t, GeminiOptions{Key: "k", Replies: []Reply{
		{Text: "calling", Tool: &ToolCall{Name: "run_shell_command", Input: map[string]any{"command": "ls"}}},
		{Text: "done", InputTokens: 7, OutputTokens: 3},
	}})
	url := g.URL + "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
	withTools := `{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"tools":[{"functionDeclarations":[]}]}`
	if code, body := scriptPost(t, url, "wrong", withTools, "x-goog-api-key"); code != 401 || !strings.Contains(body, "UNAUTHENTICATED") {
		t.Errorf("wrong key: %d %s", code, body)
	}
	code, body := scriptPost(t, url, "k", withTools, "x-goog-api-key")
	if code != 200 || !strings.HasPrefix(body, "data: ") || !strings.Contains(body, `"functionCall":{"args":{"command":"ls"},"name":"run_shell_command"}`) {
		t.Errorf("first reply: %d %s", code, body)
	}
	// A side request without tools does not use up the script.
	if _, body := scriptPost(t, g.URL+"/v1beta/models/flash:generateContent", "k", `{"contents":[]}`, "x-goog-api-key"); !strings.Contains(body, `"text":"ok"`) {
		t.Errorf("side request: %s", body)
	}
	_, body = scriptPost(t, url, "k", withTools, "x-goog-api-key")
	if !strings.Contains(body, `"text":"done"`) || !strings.Contains(body, `"promptTokenCount":7`) {
		t.Errorf("second reply: %s", body)
	}
	reqs := g.Requests()
	if len(reqs) != 4 || reqs[0].KeyOK || !reqs[1].Main || reqs[1].Reply != 0 || reqs[2].Main || reqs[3].Reply != 1 || reqs[1].Model != "gemini-2.5-pro" || reqs[1].LastUser != "hi" {
		t.Errorf("requests: %+v", reqs)
	}

	e := MustGemini(t, GeminiOptions{Status: 429})
	if code, body := scriptPost(t, e.URL+"/v1beta/models/m:streamGenerateContent", "", withTools, "x-goog-api-key"); code != 429 || !strings.Contains(body, "RESOURCE_EXHAUSTED") {
		t.Errorf("status 429: %d %s", code, body)
	}
}
