//go:build integration

package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/corral-dev/corral/internal/service"
	"github.com/corral-dev/corral/internal/task"
	"github.com/corral-dev/corral/internal/testenv"
)

var uiShots = flag.String("ui.screenshots", "", "write the web UI tests' page screenshots (1280×800 PNG) to this directory (default: a temporary one)")

// browser is a headless Chromium on one tab, driven over the DevTools
// protocol. Every page it opens gets a flag a payload would set
// (window.__xss) and a list of the Content-Security-Policy violations
// (window.__csp), and the test fails on any script error the app throws.
type browser struct {
	t   *testing.T
	ctx context.Context

	mu     sync.Mutex
	errors []string
}

// pageGuard runs before any script of every document the tab opens.
const pageGuard = `window.__xss = 0; window.__csp = [];
document.addEventListener('securitypolicyviolation', (e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));`

// newBrowser starts Debian's Chromium with a 1280×800 viewport; it answers
// every confirm() with OK.
func newBrowser(t *testing.T) *browser {
	t.Helper()
	path := testenv.RequireChromium(t)
	// Chromium leaves a directory of its own (org.chromium.Chromium.*)
	// in TMPDIR at every start: this one goes once it has exited (not
	// t.TempDir, which fails the test if the browser still writes there).
	tmp, err := os.MkdirTemp("", "corral-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // the tests run as root, where Chromium's own sandbox cannot start
		chromedp.WindowSize(1280, 800),
		chromedp.Env("TMPDIR="+tmp),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	b := &browser{t: t}
	var ctx context.Context
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithListener(func(ev any) {
		switch e := ev.(type) {
		case *runtime.EventExceptionThrown:
			d := e.ExceptionDetails
			msg := d.Text
			if d.Exception != nil {
				msg += " " + d.Exception.Description
			}
			b.fail("exception: " + msg)
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError {
				var args []string
				for _, a := range e.Args {
					args = append(args, string(a.Value)+a.Description)
				}
				b.fail("console.error: " + strings.Join(args, " "))
			}
		case *page.EventJavascriptDialogOpening:
			go chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}))
	b.ctx = ctx
	t.Cleanup(func() {
		cancel()
		cancelAlloc() // waits for the browser to exit
		os.RemoveAll(tmp)
	})
	// The first run starts the browser, which lives as long as its
	// context: this one has no timeout.
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 800), chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		_, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: pageGuard})
		return err
	})); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	t.Cleanup(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, e := range b.errors {
			t.Errorf("the page reported %s", e)
		}
	})
	return b
}

func (b *browser) fail(msg string) {
	b.mu.Lock()
	b.errors = append(b.errors, msg)
	b.mu.Unlock()
}

// do runs actions, failing the test if they fail within a minute.
func (b *browser) do(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatal(err)
	}
}

// eval evaluates a JavaScript expression and returns its value.
func eval[T any](b *browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("evaluate %.200s: %v", expr, err)
	}
	return v
}

// exec runs JavaScript for its effect.
func (b *browser) exec(expr string) {
	b.t.Helper()
	eval[any](b, "void ("+expr+")")
}

// wait polls a JavaScript expression until it is true. The page may be
// between two documents meanwhile (the app loads the page again when a
// module of it did not load): a poll that finds no document to evaluate
// in counts as not yet.
func (b *browser) wait(what, expr string, within time.Duration) {
	b.t.Helper()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("!!("+expr+")"))
		cancel()
		if err != nil && !betweenDocuments(err) {
			b.t.Fatalf("evaluate %.200s: %v", expr, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("waited %s for %s at %s; the page says:\n%.2000s", within, what,
				eval[string](b, `location.href + ' (' + document.readyState + ')'`), eval[string](b, `document.body ? document.body.innerText : ''`))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// betweenDocuments reports whether an evaluation failed for want of a
// document to run in: the page was navigating. Chromium says so in one of
// three ways, depending on when in the navigation the evaluation came;
// "Inspected target navigated or closed" is what a CI run got during the
// token prompt's wait, after the test's own navigation had ended: the
// page's one other navigation is boot.js loading it again when a module
// fetch was aborted by a network change (internal/webui/static/assets/boot.js).
func betweenDocuments(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "Execution context was destroyed") || strings.Contains(msg, "Cannot find default execution context") ||
		strings.Contains(msg, "Inspected target navigated or closed")
}

// text is the text content of the first element sel matches ("" if none).
func (b *browser) text(sel string) string {
	b.t.Helper()
	return eval[string](b, fmt.Sprintf(`(document.querySelector(%s) || {}).textContent || ''`, js(sel)))
}

// set gives a form control a value, as typing or choosing would.
func (b *browser) set(sel, value string) {
	b.t.Helper()
	if !eval[bool](b, fmt.Sprintf(`(() => { const e = document.querySelector(%s); if (!e) return false; e.value = %s;
		e.dispatchEvent(new Event('input', {bubbles: true})); e.dispatchEvent(new Event('change', {bubbles: true})); return true; })()`, js(sel), js(value))) {
		b.t.Fatalf("no %s to set", sel)
	}
}

// click clicks the first element sel matches once it is visible, with the
// element's own click(): a mouse click at its coordinates could land on
// another element while the page lays out what a fetch just brought.
func (b *browser) click(sel string) {
	b.t.Helper()
	b.do(chromedp.WaitVisible(chromedp.CSS(sel)))
	b.exec(fmt.Sprintf(`document.querySelector(%s).click()`, js(sel)))
}

// signIn waits for the token prompt and answers it.
func (b *browser) signIn(token string) {
	b.t.Helper()
	// (While the page loads, or loads again, there is no dialog yet.)
	b.wait("the token prompt", `document.getElementById('token-dialog')?.open`, 20*time.Second)
	b.do(chromedp.SendKeys(chromedp.CSS("#token-input"), token), chromedp.Click(chromedp.CSS(`#token-form button[type=submit]`)))
	b.wait("the prompt to close", `!document.getElementById('token-dialog').open`, 10*time.Second)
}

// safe fails the test if a payload ran or the CSP blocked anything.
func (b *browser) safe(where string) {
	b.t.Helper()
	xss := eval[int](b, `window.__xss`)
	csp := eval[[]string](b, `window.__csp`)
	if xss != 0 || len(csp) != 0 {
		b.t.Errorf("%s: window.__xss = %d, CSP violations %q; want 0 and none", where, xss, csp)
	}
}

// screenshot saves the viewport as name.png in dir.
func (b *browser) screenshot(dir, name string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	buf, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		b.t.Fatal(err)
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(buf))
	if err != nil || cfg.Width != 1280 || cfg.Height != 800 {
		b.t.Errorf("screenshot of %s: %dx%d, %v; want a 1280x800 PNG", name, cfg.Width, cfg.Height, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), buf, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

func js(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// chartPNG is a small bar chart, w×h pixels.
func chartPNG(t *testing.T, w, h int) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	heights := []int{40, 75, 30, 90, 60, 20, 80, 50}
	for x := 0; x < w; x++ {
		bar := x * len(heights) / w
		for y := 0; y < h; y++ {
			c := color.RGBA{250, 251, 253, 255}
			if x%(w/len(heights)) > 3 && h-y < heights[bar]*h/100 {
				c = color.RGBA{47, 91, 234, 255}
			}
			img.Set(x, y, c)
		}
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

const uiToken = "ui-test-token-0123456789"

// startUIServer starts a server with a token, so the UI must ask for it.
func startUIServer(t *testing.T) *server {
	t.Helper()
	testenv.RequireChromium(t)
	return MustStartEnv(t, []string{"CORRAL_API_TOKEN=" + uiToken}, nil)
}

// A person spawns a task from the form with a dropped attachment and,
// without reloading, watches it go from queued to success and sees its
// PNG output.
func TestUISpawnAndWatch(t *testing.T) {
	t.Parallel()
	s := startUIServer(t)
	s.mustWriteWorkspace(t, "data/chart.png", chartPNG(t, 64, 48))
	b := newBrowser(t)
	b.do(chromedp.Navigate(s.url + "/spawn"))
	b.signIn(uiToken)
	b.wait("the spawn form", `document.querySelector('#spawn-worker textarea')`, 20*time.Second)
	b.set(`#spawn-worker [name=task_description]`, "Chart the spending and keep my notes")
	b.set(`#spawn-worker [name=agent]`, "command")
	b.set(`#spawn-worker [name=command]`, "sleep 2; cp /workspace/shared/data/chart.png output/chart.png && cp context/notes.txt output/notes.txt && echo charted")
	b.set(`#spawn-worker [name=labels]`, "team=ui")
	// A file dropped on the form uploads as an attachment.
	b.exec(`(() => {
		const dt = new DataTransfer();
		dt.items.add(new File(['notes from the drop'], 'notes.txt', {type: 'text/plain'}));
		document.querySelector('#spawn-worker .dropzone').dispatchEvent(new DragEvent('drop', {dataTransfer: dt, bubbles: true, cancelable: true}));
	})()`)
	b.wait("the attachment to upload", `document.querySelector('#spawn-worker .uploads li.uploaded')`, 20*time.Second)
	// A reload would lose this.
	b.exec(`window.__sameDocument = 'yes'`)
	b.click(`#spawn-worker button[type=submit]`)
	b.wait("the task's page", `location.pathname.startsWith('/tasks/task-')`, 20*time.Second)

	var seen []string
	deadline := time.Now().Add(90 * time.Second)
	for {
		st := b.text(".task-head .badge")
		if len(seen) == 0 || seen[len(seen)-1] != st {
			seen = append(seen, st)
		}
		if st == "success" || task.Status(st).Terminal() || time.Now().After(deadline) {
			break
		}
		time.Sleep(30 * time.Millisecond)
	}
	if seen[len(seen)-1] != "success" || !(strings.Contains(strings.Join(seen, " "), "queued") || strings.Contains(strings.Join(seen, " "), "running")) {
		t.Fatalf("statuses the page showed: %q; want queued or running, then success", seen)
	}
	if eval[string](b, `window.__sameDocument`) != "yes" {
		t.Errorf("the page reloaded between the form and the task's end")
	}
	b.wait("the chart shown from a blob: URL", `[...document.querySelectorAll('.gallery img')].some((i) => i.src.startsWith('blob:') && i.naturalWidth === 64 && i.naturalHeight === 48)`, 20*time.Second)
	files := eval[[]string](b, `[...document.querySelectorAll('.files-table tbody td:first-child')].map((td) => td.textContent)`)
	if strings.Join(files, ",") != "chart.png,notes.txt" {
		t.Errorf("output files listed: %q", files)
	}
	id := eval[string](b, `location.pathname.split('/').pop()`)
	res := s.wait(t, id, 10*time.Second, "notes.txt")
	if res.FileContents["notes.txt"].Content != "notes from the drop" || res.Labels["team"] != "ui" {
		t.Errorf("the task got %q and labels %v", res.FileContents["notes.txt"].Content, res.Labels)
	}
	b.safe("task page")
}

// Cancel on a running task's page ends it, and the page shows it.
func TestUICancelRunningTask(t *testing.T) {
	t.Parallel()
	s := startUIServer(t)
	tk := s.spawn(t, "Wait a long time", "sleep", "300")
	s.waitStatus(t, tk.ID, task.Running, 30*time.Second)
	b := newBrowser(t)
	b.do(chromedp.Navigate(s.url + "/tasks/" + tk.ID))
	b.signIn(uiToken)
	b.wait("the running task", `document.querySelector('.task-head .badge')?.textContent === 'running'`, 20*time.Second)
	b.click("#cancel-task") // the confirm() is answered OK
	b.wait("the task cancelled", `document.querySelector('.task-head .badge')?.textContent === 'cancelled'`, 60*time.Second)
	got, err := s.client.Get(context.Background(), tk.ID)
	if err != nil || got.Status != task.Cancelled {
		t.Errorf("the server says %s, %v; want cancelled", got.Status, err)
	}
}

// The workspace browser walks shared/, shows a CSV as a table and Markdown
// rendered, uploads into shared/, and lists the named workspaces.
func TestUIWorkspaceBrowse(t *testing.T) {
	t.Parallel()
	s := startUIServer(t)
	ctx := context.Background()
	for p, c := range map[string]string{"data/sales.csv": "region,amount\nnorth,10\nsouth,20\n", "notes/readme.md": "# Readme\n\nSome *notes*.\n"} {
		s.mustWriteWorkspace(t, p, []byte(c))
	}
	if _, err := s.client.CreateProject(ctx, service.CreateProjectRequest{Name: "demo"}); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t)
	b.do(chromedp.Navigate(s.url + "/workspace"))
	b.signIn(uiToken)
	b.wait("shared/'s listing", `location.pathname === '/workspace/shared/' && document.querySelector('a[href$="/workspace/shared/data/"]')`, 20*time.Second)
	b.click(`a[href$="/workspace/shared/data/"]`)
	b.wait("data/", `document.querySelector('a[href$="/workspace/shared/data/sales.csv"]')`, 20*time.Second)
	b.click(`a[href$="/workspace/shared/data/sales.csv"]`)
	b.wait("the CSV as a table", `[...document.querySelectorAll('.file-view td')].map((td) => td.textContent).join(',') === 'north,10,south,20'`, 20*time.Second)
	b.do(chromedp.Navigate(s.url + "/workspace/shared/notes/readme.md"))
	b.wait("the Markdown rendered", `document.querySelector('.file-view .markdown h1')?.textContent === 'Readme' && document.querySelector('.file-view .markdown em')?.textContent === 'notes'`, 20*time.Second)

	upload := filepath.Join(t.TempDir(), "upload.txt")
	os.WriteFile(upload, []byte("uploaded from the browser"), 0o644)
	b.do(chromedp.Navigate(s.url + "/workspace/shared/data/"))
	b.wait("the upload button", `document.getElementById('ws-upload')`, 20*time.Second)
	b.do(chromedp.SetUploadFiles(chromedp.CSS("#ws-upload"), []string{upload}))
	b.wait("the uploaded file listed", `document.querySelector('a[href$="/workspace/shared/data/upload.txt"]')`, 20*time.Second)
	f, err := s.client.ReadWorkspace(ctx, "data/upload.txt")
	if err != nil || f.Content != "uploaded from the browser" {
		t.Errorf("shared/data/upload.txt: %q, %v", f.Content, err)
	}
	b.wait("the named workspace listed", `document.querySelector('a[href$="/workspace/projects/demo/"]')`, 20*time.Second)
	b.click(`a[href$="/workspace/projects/demo/"]`)
	b.wait("the named workspace, read-only", `location.pathname === '/workspace/projects/demo/' && document.querySelector('.toolbar')?.textContent.includes('read-only')`, 20*time.Second)
}

// xssPayloads are worker-chosen file names and contents, each of which
// sets window.__xss if the page ever treats it as markup or script.
var xssPayloads = map[string]string{
	`<img src=x onerror="window.__xss=1">.txt`: `<script>window.__xss=2</script>`,
	"report.md": "# Report <script>window.__xss=3</script>\n\n[click me](javascript:window.__xss=4)\n\n" +
		`<img src=x onerror="window.__xss=5">` + "\n\n![pic](javascript:window.__xss=6) ![remote](http://127.0.0.1:9/x.png)\n\n" +
		"| a | b |\n|---|---|\n| <b onmouseover=window.__xss=7>x</b> | [j](JaVaScRiPt:window.__xss=8) |\n",
	"chart.svg": `<svg xmlns="http://www.w3.org/2000/svg" onload="window.__xss=9"><script>window.__xss=10</script><rect width="10" height="10"/></svg>`,
	"page.html": `<html><body><script>window.__xss=11</script><img src=x onerror="window.__xss=12"></body></html>`,
	"data.csv":  "name,value\n\"<img src=x onerror=window.__xss=13>\",1\n",
	"script.py": "print('<script>window.__xss=14</script>')\n",
	"fake.png":  `<html><script>window.__xss=15</script></html>`,
}

// Nothing a worker writes runs in the page: names, summary, Markdown,
// SVG, HTML, CSV, text and the transcript all reach it as text.
func TestUIXSS(t *testing.T) {
	t.Parallel()
	s := startUIServer(t)
	var script strings.Builder
	for name, content := range xssPayloads {
		fmt.Fprintf(&script, "printf '%%s' %s > output/%s\n", shellQuote(content), shellQuote(name))
	}
	// The summary (the agent's last words) and the transcript carry one too.
	script.WriteString(`echo '<img src=x onerror="window.__xss=16"><script>window.__xss=17</script>'` + "\n")
	tk := mustSpawn(t, s.client, service.SpawnRequest{
		TaskDescription: `<script>window.__xss=18</script> write hostile outputs`,
		Agent:           "command", Command: []string{"sh", "-c", script.String()},
		Labels: map[string]string{"x": `<img src=x onerror="window.__xss=19">`},
	})
	if res := s.wait(t, tk.ID, 60*time.Second); res.Status != task.Success || len(res.OutputFiles) != len(xssPayloads) {
		t.Fatalf("task %s with %d outputs: %s", res.Status, len(res.OutputFiles), res.ErrorMessage)
	}
	b := newBrowser(t)
	b.do(chromedp.Navigate(s.url + "/tasks/" + tk.ID))
	b.signIn(uiToken)
	b.wait("the outputs listed", fmt.Sprintf(`document.querySelectorAll('.files-table tbody tr').length === %d`, len(xssPayloads)), 20*time.Second)
	if got := b.text(".task-head h1"); !strings.Contains(got, "<script>") {
		t.Errorf("the title shows %q, want the description as text", got)
	}
	// (Rendered as Markdown: the payload's underscores are emphasis.)
	if got := b.text(".result .markdown"); !strings.Contains(got, `<img src=x onerror="window.`) || !strings.Contains(got, "<script>") {
		t.Errorf("the summary shows %q, want the worker's text as text", got)
	}
	// Open every output's preview in turn.
	for i := range len(xssPayloads) {
		b.exec(fmt.Sprintf(`document.querySelectorAll('.files-table tbody tr')[%d].querySelector('button').click()`, i))
		b.wait("a preview", `!document.querySelector('.file-preview')?.textContent.includes('Loading')`, 20*time.Second)
		b.safe(fmt.Sprintf("preview %d", i))
	}
	// The Markdown report: the script and raw HTML as text, no javascript:
	// link, no image loaded from anywhere.
	b.exec(`[...document.querySelectorAll('.files-table tbody tr')].find((tr) => tr.firstChild.textContent === 'report.md').querySelector('button').click()`)
	b.wait("report.md rendered", `document.querySelector('.file-preview .markdown h1')?.textContent.includes('<script>')`, 20*time.Second)
	hrefs := eval[[]string](b, `[...document.querySelectorAll('a')].map((a) => a.getAttribute('href'))`)
	srcs := eval[[]string](b, `[...document.querySelectorAll('img')].map((i) => i.getAttribute('src'))`)
	for _, h := range hrefs {
		if strings.Contains(strings.ToLower(h), "javascript:") {
			t.Errorf("a link to %q", h)
		}
	}
	for _, src := range srcs {
		if !strings.HasPrefix(src, "blob:") && !strings.HasPrefix(src, "/assets/") {
			t.Errorf("an image from %q", src)
		}
	}
	// The SVG and the HTML are shown as source, never rendered.
	frames := eval[int](b, `document.querySelectorAll('main svg, main iframe, main object, main embed').length`)
	svgs := eval[int](b, `document.querySelectorAll('img[src^="blob:"]').length`)
	if frames != 0 || svgs != 0 {
		t.Errorf("%d svg/iframe/object/embed elements and %d images shown; want none (no output here is a real image)", frames, svgs)
	}
	for _, tab := range []string{"transcript", "stderr", "prompt", "events", "result"} {
		b.exec(fmt.Sprintf(`document.querySelector('[data-tab=%s]').click()`, tab))
		b.wait(tab, `!document.querySelector('.tab-panel')?.textContent.includes('Loading')`, 20*time.Second)
		b.safe(tab)
	}
	if got := b.text(".tab-panel"); !strings.Contains(got, "window.__xss=16") {
		t.Errorf("the result tab does not show the summary as text: %.300s", got)
	}
	b.do(chromedp.Navigate(s.url + "/tasks"))
	b.wait("the list", `document.querySelector('tr[data-id]')`, 20*time.Second)
	b.safe("task list")
}

// shellQuote quotes s for sh.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
