//go:build integration

package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/notify"
	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
)

// A session made from the form runs commands in its console, which shows
// stdout, stderr and the exit code as they come; ending it works too.
func TestUISessionConsole(t *testing.T) {
	t.Parallel()
	s := startUIServer(t)
	b := newBrowser(t)
	b.do(chromedp.Navigate(s.url + "/sessions"))
	b.signIn(uiToken)
	b.wait("the session form", `document.querySelector('#create-session')`, 20*time.Second)
	b.click(`#create-session button[type=submit]`)
	b.wait("the session's page with its token", `location.pathname.startsWith('/sessions/') && document.querySelector('.alert-info code')?.textContent.length > 10`, 60*time.Second)
	b.set(`.console-input [name=command]`, `echo hello-from-session; sleep 1; echo oops >&2; exit 3`)
	b.click(`.console-input button[type=submit]`)
	b.wait("the first line before the command ends", `document.querySelector('.console').textContent.includes('hello-from-session')`, 30*time.Second)
	b.wait("stderr and the exit code", `document.querySelector('.console .console-err')?.textContent === 'oops\n' && document.querySelector('.console .console-exit')?.textContent.startsWith('[exit 3')`, 30*time.Second)
	// Suspend, resume and fork from the head's buttons, each said in the
	// session's history.
	b.click(`.page-head [name=suspend]`)
	b.wait("the session suspended, what it kept said", `document.querySelector('.page-head .badge')?.textContent === 'suspended' && document.querySelector('.page-head').textContent.includes('files kept') && document.querySelector('#session-history').textContent.includes('suspended')`, 60*time.Second)
	b.click(`.page-head [name=resume]`)
	b.wait("the session resumed", `document.querySelector('.page-head .badge')?.textContent === 'running' && document.querySelector('#session-history').textContent.includes('resumed')`, 60*time.Second)
	b.click(`.page-head [name=fork]`)
	b.wait("the fork, its link and token", `document.querySelector('.alert-info a[href*="/sessions/sess-"]') && document.querySelector('#session-history').textContent.includes('1 fork,')`, 60*time.Second)
	b.click(`.page-head .btn-danger`) // End session; confirm() is answered OK
	b.wait("the session ended", `document.querySelector('.page-head .badge')?.textContent === 'ended' && document.querySelector('#session-history').textContent.includes('ended')`, 30*time.Second)
	b.safe("session")
}

// Every page renders, without a script error, at 1280×800; the
// screenshots go to -ui.screenshots (docs/ui in docs/web-ui.md's command).
func TestUIPages(t *testing.T) {
	t.Parallel()
	key := filepath.Join(t.TempDir(), "notify.key")
	os.WriteFile(key, []byte(notify.NewSecret()), 0o600)
	s := MustStartEnv(t, []string{"CORRAL_API_TOKEN=" + uiToken}, func(c *config.Config) {
		// A host that is not listening: its notifications become dead
		// letters for the deliveries page.
		c.Notify.URL = fmt.Sprintf("http://127.0.0.1:%d/hook", freePort(t))
		c.Notify.SecretFile = key
		c.Notify.MaxAttempts = 1
	})
	ctx := context.Background()
	dir := *uiShots
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Something to show on each page.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := s.client.WriteWorkspace(ctx, "data/chart.png", chartPNG(t, 560, 260))
	must(err)
	_, err = s.client.WriteWorkspace(ctx, "data/spending.csv", []byte("category,amount\nRent,1200\nGroceries,412.50\nTransport,86.20\n"))
	must(err)
	_, err = s.client.WriteWorkspace(ctx, "scripts/totals.py", []byte("import csv, sys\n\n# Sum each category of a statement.\ntotals = {}\nfor row in csv.DictReader(open(sys.argv[1])):\n    totals[row['category']] = totals.get(row['category'], 0) + float(row['amount'])\nprint(totals)\n"))
	must(err)
	failed := s.spawn(t, "Import last year's statements", "sh", "-c", "echo 'statements/2025 not found' >&2; exit 2")
	chart, _, err := s.client.Spawn(ctx, service.SpawnRequest{
		TaskDescription: "Chart my spending by category from spending.csv and write a short report",
		Agent:           "command", ContextFiles: []string{"data/chart.png", "data/spending.csv"},
		Labels: map[string]string{"team": "finance"}, ConversationID: "chat-7",
		Command: []string{"sh", "-c", "cp context/chart.png output/chart.png; cp /workspace/shared/scripts/totals.py output/; " +
			"printf '# Spending report\\n\\nRent is **71%%** of the total (1,698.70).\\n\\n| category | amount |\\n|---|---|\\n| Rent | 1200.00 |\\n| Groceries | 412.50 |\\n| Transport | 86.20 |\\n' > output/report.md; " +
			"cp context/spending.csv output/totals.csv; echo 'Rent is 71% of the spending; the chart is in chart.png and the table in report.md.'"},
	})
	must(err)
	s.wait(t, chart.ID, 60*time.Second)
	s.wait(t, failed.ID, 60*time.Second)
	running := s.spawn(t, "Train the forecasting model on three years of statements", "sleep", "300")
	s.waitStatus(t, running.ID, task.Running, 30*time.Second)
	_, err = s.client.CreateSkill(ctx, service.CreateSkillRequest{Name: "expense-analyzer", Description: "Categorise bank statement lines and total them by month.", Instructions: "# Expense analyzer\n\nRun `python3 analyze.py statement.csv`.\n"})
	must(err)
	note := "Rent went up in March; groceries are steady."
	_, err = s.client.IngestDocument(ctx, service.IngestRequest{Title: "Budget notes", Content: &note})
	must(err)

	b := newBrowser(t)
	b.do(chromedp.Navigate(s.url + "/tasks"))
	b.signIn(uiToken)
	for _, p := range []struct{ name, path, ready string }{
		{"tasks", "/tasks", `document.querySelectorAll('tr[data-id]').length === 3 && document.querySelector('.live-live')`},
		{"task", "/tasks/" + chart.ID, `[...document.querySelectorAll('.gallery img')].some((i) => i.naturalWidth === 560)`},
		{"task-running", "/tasks/" + running.ID, `document.querySelector('.task-head .badge')?.textContent === 'running'`},
		{"spawn", "/spawn", `document.querySelector('#spawn-worker')`},
		{"workspace", "/workspace/shared/data/spending.csv", `document.querySelector('.file-view table')`},
		{"sessions", "/sessions", `document.querySelector('#create-session')`},
		{"skills", "/skills", `document.querySelector('.skill-card')`},
		{"documents", "/documents?q=rent", `document.querySelector('.result-item')`},
		{"deliveries", "/deliveries", `document.querySelector('.delivery-failed')`},
		{"health", "/health", `document.querySelector('.checks')`},
	} {
		b.do(chromedp.Navigate(s.url + p.path))
		b.wait(p.name+" page", p.ready, 90*time.Second)
		b.safe(p.name)
		b.screenshot(dir, p.name)
	}
}
