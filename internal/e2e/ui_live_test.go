//go:build integration

package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/corral-dev/corral/internal/httpapi"
)

// liveReady is true once the sidebar's indicator says the app follows the
// server's events.
const liveReady = `document.getElementById('live')?.textContent === 'live' && document.querySelector('#live.live-live') !== null`

// The sidebar's live indicator says live on every page while the server is
// up, opened by its address or reached through the app's own links: not
// only on the pages that follow a stream of their own.
func TestUILiveOnEveryPage(t *testing.T) {
	t.Parallel()
	s := startUIServer(t)
	tk := s.spawn(t, "for the task's page", "true")
	b := newBrowser(t)
	b.do(chromedp.Navigate(s.url + "/health"))
	b.signIn(uiToken)
	for _, path := range []string{"/tasks", "/tasks/" + tk.ID, "/spawn", "/workspace", "/sessions", "/skills", "/documents", "/deliveries", "/health"} {
		b.do(chromedp.Navigate(s.url + path))
		b.wait("live on "+path, liveReady, 30*time.Second)
	}
	// Through the sidebar's links, without a reload: leaving a page that
	// follows its own stream leaves the indicator live.
	for _, section := range []string{"tasks", "skills", "sessions", "health"} {
		b.click(fmt.Sprintf(`.nav a[data-section=%s]`, section))
		b.wait("the "+section+" page, live", fmt.Sprintf(`document.querySelector('.nav a.active')?.dataset.section === %s && %s`, js(section), liveReady), 30*time.Second)
	}
	b.safe("live")
}

// A session's page shows in its console the commands run in the session
// before it opened, each with its exit code and when, in order; a command
// with markup in it is shown as text and runs nothing in the page.
func TestUISessionEarlierCommands(t *testing.T) {
	t.Parallel()
	s := startUIServer(t)
	ctx := context.Background()
	created := mustCreateSession(t, s.client)
	// Strings run with sh -c, as the console sends them, and an argv,
	// which is shown joined.
	commands := []string{
		"echo first",
		`echo '<script>window.__xss=21</script><img src=x onerror="window.__xss=22">'; exit 4`,
		"printf 'a\\\\b \"quoted\"\\n'",
		"echo from an argv",
	}
	for i, c := range commands {
		cmd := shell(c)
		if i == len(commands)-1 {
			cmd = json.RawMessage(`["echo", "from", "an", "argv"]`)
		}
		if _, err := s.client.ExecSession(ctx, created.SessionID, httpapi.ExecBody{Command: cmd}, func(httpapi.ExecChunk) error { return nil }); err != nil {
			t.Fatalf("exec %s: %v", cmd, err)
		}
	}

	b := newBrowser(t)
	b.do(chromedp.Navigate(s.url + "/sessions/" + created.SessionID))
	b.signIn(uiToken)
	b.wait("the earlier commands in the console", fmt.Sprintf(`document.querySelectorAll('#session-console .console-earlier').length === %d`, len(commands)), 30*time.Second)
	shown := eval[[]string](b, `[...document.querySelectorAll('#session-console .console-earlier .console-cmd')].map((e) => e.textContent)`)
	for i, c := range commands {
		if i >= len(shown) || shown[i] != "$ "+c {
			t.Errorf("earlier command %d shown as %q, want %q", i, shown, "$ "+c)
		}
	}
	exits := eval[[]string](b, `[...document.querySelectorAll('#session-console .console-earlier .console-exit')].map((e) => e.textContent)`)
	if len(exits) != 4 || !strings.HasPrefix(exits[0], "[exit 0,") || !strings.HasPrefix(exits[1], "[exit 4,") || !strings.HasPrefix(exits[2], "[exit 0,") || !strings.HasPrefix(exits[3], "[exit 0,") {
		t.Errorf("exit codes shown %q, want 0, 4, 0, 0", exits)
	}
	if n := eval[int](b, `document.querySelectorAll('#session-console .console-earlier time[datetime]').length`); n != len(commands) {
		t.Errorf("%d earlier commands say when they ran, want %d", n, len(commands))
	}
	if n := eval[int](b, `document.querySelectorAll('#session-console script, #session-console img').length`); n != 0 {
		t.Errorf("the console holds %d script or img elements, want none", n)
	}
	// The session's history lists its lifecycle, not its commands again.
	b.wait("the history", `document.querySelector('#session-history').textContent.includes('created')`, 10*time.Second)
	if text := eval[string](b, `document.querySelector('#session-history').textContent`); strings.Contains(text, "exec") || strings.Contains(text, "first") {
		t.Errorf("the history card lists the commands: %q", text)
	}
	// Arrow up in the input brings back the last command typed (the
	// argv was not).
	b.exec(`document.querySelector('.console-input [name=command]').dispatchEvent(new KeyboardEvent('keydown', {key: 'ArrowUp'}))`)
	if v := eval[string](b, `document.querySelector('.console-input [name=command]').value`); v != commands[2] {
		t.Errorf("arrow up: %q, want the last command typed %q", v, commands[2])
	}
	b.safe("session")
}
