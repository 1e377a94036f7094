package agenttest

import (
	"strings"
	"testing"
)

func TestOpenAIScript(t *testing.T) {
	o := MustOpenAI(t, OpenAIOptions{Key: "k", Replies: []Reply{
		{Text: "calling", Tool: &ToolCall{Name: "exec_command", Input: map[string]any{"cmd": "ls"}}},
		{Text: "done"},
	}})
	body := `{"model":"gpt-5","stream":true,"input":[{"role":"user"}],"tools":[{"type":"function","name":"exec_command"}]}`
	if code, resp := scriptPost(t, o.URL+"/responses", "Bearer wrong", body, "Authorization"); code != 401 || !strings.Contains(resp, "invalid_api_key") {
		t.Errorf("wrong key: %d %s", code, resp)
	}
	code, resp := scriptPost(t, o.URL+"/responses", "Bearer k", body, "Authorization")
	for _, want := range []string{"event: response.created", `"delta":"calling"`, `"type":"function_call"`, `"arguments":"{\"cmd\":\"ls\"}"`, "event: response.completed", `"input_tokens":100`} {
		if code != 200 || !strings.Contains(resp, want) {
			t.Errorf("first reply lacks %s: %d\n%s", want, code, resp)
		}
	}
	second := `{"model":"gpt-5","stream":true,"input":[{"role":"user"},{"type":"function_call","call_id":"call_02"},{"type":"function_call_output","call_id":"call_02","output":"exit 0"}],"tools":[{"type":"function","name":"exec_command"}]}`
	_, resp = scriptPost(t, o.URL+"/responses", "Bearer k", second, "Authorization")
	if !strings.Contains(resp, `"text":"done"`) || strings.Contains(resp, "function_call") {
		t.Errorf("second reply: %s", resp)
	}
	reqs := o.Requests()
	if len(reqs) != 3 || reqs[0].KeyOK || reqs[1].Reply != 0 || reqs[2].Reply != 1 || reqs[1].Model != "gpt-5" || !reqs[1].Stream || reqs[1].Tools[0] != "exec_command" ||
		reqs[1].LastOutput != "" || reqs[2].LastOutput != `"exit 0"` || reqs[2].Input != 3 {
		t.Errorf("requests: %+v", reqs)
	}
	e := MustOpenAI(t, OpenAIOptions{Status: 500})
	if code, resp := scriptPost(t, e.URL+"/responses", "", body, "Authorization"); code != 500 || !strings.Contains(resp, "server_error") {
		t.Errorf("status 500: %d %s", code, resp)
	}
}
