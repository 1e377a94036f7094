package app

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/config"
	"github.com/corral-dev/corral/internal/eventstore/postgres/postgrestest"
)

// Doctor says whether an agent's environment holds its credentials, by
// the variable's name, never its value, and shows a base URL without what
// may be secret in it.
func TestCredentialCheck(t *testing.T) {
	const secret = "sk-ant-very-secret-0123456789"
	for _, c := range []struct {
		agent   string
		env     []string
		ok      bool
		mention []string
	}{
		{"claude", nil, false, []string{"no credentials", "ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN", "agents.claude.env"}},
		{"claude", []string{"ANTHROPIC_API_KEY="}, false, []string{"no credentials"}},
		{"claude", []string{"ANTHROPIC_API_KEY=" + secret}, true, []string{"ANTHROPIC_API_KEY set"}},
		{"claude", []string{"CLAUDE_CODE_OAUTH_TOKEN=" + secret, "ANTHROPIC_BASE_URL=http://user:" + secret + "@127.0.0.1:8080/v1?key=" + secret},
			true, []string{"CLAUDE_CODE_OAUTH_TOKEN set", "ANTHROPIC_BASE_URL points at http://127.0.0.1:8080/v1"}},
		{"gemini", []string{"OPENAI_API_KEY=" + secret}, false, []string{"GEMINI_API_KEY, GOOGLE_API_KEY", "agents.gemini.env"}},
		{"codex", []string{"OPENAI_API_KEY=" + secret}, true, []string{"OPENAI_API_KEY set"}},
		{"opencode", []string{"OPENCODE_CONFIG_CONTENT={}"}, true, []string{"OPENCODE_CONFIG_CONTENT set"}},
		{"command", nil, true, []string{"needs no credentials"}},
	} {
		detail, ok := credentialCheck(c.agent, c.env)
		if ok != c.ok {
			t.Errorf("%s %q: ok %v, want %v (%s)", c.agent, c.env, ok, c.ok, detail)
		}
		for _, m := range c.mention {
			if !strings.Contains(detail, m) {
				t.Errorf("%s: %q does not say %q", c.agent, detail, m)
			}
		}
		if strings.Contains(detail, secret) || strings.Contains(detail, "very-secret") {
			t.Errorf("%s: %q shows the secret", c.agent, detail)
		}
	}
	if fix := credentialFix("claude"); !strings.Contains(fix, `ANTHROPIC_API_KEY: "${ANTHROPIC_API_KEY}"`) || !strings.Contains(fix, "--config.expand-env") {
		t.Errorf("fix %q", fix)
	}
}

// The health page's doctor runs once per ttl, however often it is asked.
func TestDoctorCache(t *testing.T) {
	runs := 0
	d := &doctorCache{ttl: time.Hour, run: func(context.Context) []Check {
		runs++
		return []Check{{Name: "runtime local", OK: true}}
	}}
	first, at := d.checks(context.Background())
	again, at2 := d.checks(context.Background())
	if runs != 1 || len(first) != 1 || len(again) != 1 || first[0].Name != "runtime local" || !at.Equal(at2) {
		t.Errorf("two calls within the ttl: %d runs, %+v at %v and %+v at %v", runs, first, at, again, at2)
	}
	d.ttl = 0
	d.checks(context.Background())
	if runs != 2 {
		t.Errorf("past the ttl: %d runs, want 2", runs)
	}
}

// Doctor times the data root's fsyncs, leaving nothing behind, and calls a
// disk slow from 10 ms.
func TestDoctorDisk(t *testing.T) {
	dir := t.TempDir()
	median, err := fsyncMedian(dir)
	if err != nil || median <= 0 {
		t.Fatalf("fsyncMedian = %v, %v; want a time", median, err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("fsyncMedian left %v", ents)
	}
	for _, c := range []struct {
		median time.Duration
		err    error
		ok     bool
		says   string
	}{
		{300 * time.Microsecond, nil, true, "0.30 ms at the median"},
		{25 * time.Millisecond, nil, false, "25.00 ms at the median"},
		{0, fs.ErrNotExist, true, "does not exist yet"},
		{0, syscall.EACCES, true, "run corral doctor as the user corral serve runs as"},
		{0, syscall.ENOTDIR, false, "cannot write in the data root"},
	} {
		got := diskCheck(dir, c.median, c.err)
		if got.OK != c.ok || !strings.Contains(got.Detail, c.says) || got.OK != (got.Fix == "") {
			t.Errorf("diskCheck(%v, %v) = %+v; want OK %v, a fix only when not, and %q", c.median, c.err, got, c.ok, c.says)
		}
	}
	// A data root that is not there yet, or is a file.
	if _, err := fsyncMedian(filepath.Join(dir, "none")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("fsyncMedian of a missing dir: %v, want ErrNotExist", err)
	}
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	if c := doctorDisk(file); c.OK || !strings.Contains(c.Detail, "cannot write") {
		t.Errorf("doctorDisk of a file = %+v, want a failure", c)
	}
}

// Doctor says whether code_execute is offered: off by default, and how to
// turn it on.
func TestDoctorExec(t *testing.T) {
	cfg := config.Default()
	if c := doctorExec(cfg); !c.OK || !strings.Contains(c.Detail, "off") || !strings.Contains(c.Detail, "EXECUTION_ENABLED=true") {
		t.Errorf("doctorExec by default = %+v, want off and how to turn it on", c)
	}
	cfg.Execution.Enabled = true
	if c := doctorExec(cfg); !c.OK || !strings.HasPrefix(c.Detail, "on ") {
		t.Errorf("doctorExec with execution.enabled = %+v, want on", c)
	}
}

// The store check: SQLite passes as it is; PostgreSQL is reached and
// described, and one that cannot be reached fails with what to do, never
// repeating the connection string (it may hold a password).
func TestDoctorStore(t *testing.T) {
	ctx := context.Background()
	if c := doctorStore(ctx, config.Default()); !c.OK || !strings.Contains(c.Detail, "SQLite") {
		t.Errorf("SQLite: %+v", c)
	}
	db := postgrestest.New(t)
	cfg, err := config.Load(config.LoadOptions{Environ: []string{"CORRAL_STORE_DRIVER=postgres", "CORRAL_STORE_DSN=" + db.DSN}})
	if err != nil {
		t.Fatal(err)
	}
	if c := doctorStore(ctx, cfg); !c.OK || !strings.Contains(c.Detail, "PostgreSQL") || !strings.Contains(c.Detail, "schema version 0") {
		t.Errorf("a fresh database: %+v", c)
	}
	const secret = "s3cret-pw"
	cfg, err = config.Load(config.LoadOptions{Environ: []string{"CORRAL_STORE_DRIVER=postgres", "CORRAL_STORE_DSN=host=127.0.0.1 port=1 password=" + secret + " connect_timeout=2"}})
	if err != nil {
		t.Fatal(err)
	}
	c := doctorStore(ctx, cfg)
	if c.OK || c.Fix == "" || strings.Contains(c.Detail+c.Fix, secret) {
		t.Errorf("an unreachable database: %+v; want a failure saying what to do, without the password", c)
	}
}

// An agent's --version that hangs, or leaves a child holding its output,
// costs the doctor agentVersionWait and no more (it took 10 s each, one
// after the other: 29 s with two such agents).
func TestAgentVersionBounded(t *testing.T) {
	dir := t.TempDir()
	for name, script := range map[string]string{
		"hangs":   "#!/bin/sh\nexec sleep 60\n",
		"forks":   "#!/bin/sh\necho 'forks 1.0'\nsleep 60 &\n",
		"answers": "#!/bin/sh\necho 'answers 2.0 (build)'\necho more\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct{ bin, want string }{
		{"hangs", "installed (version unknown: no answer to --version within 3s)"},
		{"forks", "installed, forks 1.0"},
		{"answers", "installed, answers 2.0 (build)"},
	} {
		start := time.Now()
		got := agentVersion(context.Background(), filepath.Join(dir, c.bin), "claude")
		if took := time.Since(start); got != c.want || took > agentVersionWait+2*time.Second {
			t.Errorf("%s: %q after %s; want %q within %s", c.bin, got, took, c.want, agentVersionWait+2*time.Second)
		}
	}
}
