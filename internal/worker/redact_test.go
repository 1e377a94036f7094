package worker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/workerproto"
	"github.com/google/go-cmp/cmp"
)

func TestSecretsPicksSecretNames(t *testing.T) {
	got := workerproto.Secrets([]string{
		"ANTHROPIC_API_KEY=sk-ant-0123456789",
		"GITHUB_TOKEN=ghp_abcdefghijkl",
		"DB_PASSWORD=hunter2hunter2",
		"SHORT_KEY=abc",         // too short to redact safely
		"PATH=/usr/bin:/bin",    // not a secret name
		"HOME=/tmp/home-secret", // name decides, not value
		"OTHER_KEY=sk-ant-0123456789",
	})
	want := []string{"sk-ant-0123456789", "ghp_abcdefghijkl", "hunter2hunter2"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Secrets (-want +got):\n%s", diff)
	}
}

func TestRedactorAcrossWrites(t *testing.T) {
	secrets := []string{"sk-SECRET-123", "tok-XYZ-9876"}
	for _, chunks := range [][]string{
		{"key is sk-SECRET-123 and tok-XYZ-9876.\n"},
		{"key is sk-SEC", "RET-123 and tok", "-XYZ-9876.\n"},
		{"k", "e", "y is s", "k", "-", "SECRET-12", "3 and tok-XYZ-987", "6", ".\n"},
	} {
		var out strings.Builder
		r := newRedactor(&out, secrets)
		for _, c := range chunks {
			if _, err := r.Write([]byte(c)); err != nil {
				t.Fatal(err)
			}
		}
		r.Close()
		if want := "key is [REDACTED] and [REDACTED].\n"; out.String() != want {
			t.Errorf("chunks %q: got %q, want %q", chunks, out.String(), want)
		}
	}
}

func TestRedactorHoldsOnlyAPossiblePrefix(t *testing.T) {
	var out strings.Builder
	r := newRedactor(&out, []string{"sk-SECRET-123"})
	r.Write([]byte("progress 50%\n"))
	if out.String() != "progress 50%\n" {
		t.Errorf("plain text was held back: %q", out.String())
	}
	r.Write([]byte("almost sk-SEC"))
	if out.String() != "progress 50%\nalmost " {
		t.Errorf("got %q, want the text up to a possible secret", out.String())
	}
	r.Close()
	if out.String() != "progress 50%\nalmost sk-SEC" {
		t.Errorf("Close did not write what was held back: %q", out.String())
	}
}

func TestRunRedactsAgentSecrets(t *testing.T) {
	dir := MustTaskDir(t)
	const key = "sk-live-0123456789abcdef"
	opts := shOptions(dir, `echo "my key is $MY_API_KEY"; echo "stderr $MY_API_KEY" >&2; echo "summary $MY_API_KEY" > output/summary.md; exit 1`)
	opts.Env = append(opts.Env, "MY_API_KEY="+key)
	MustRun(t, opts)
	st := mustReadStatus(t, dir)
	for _, name := range []string{"status.json", "logs/stdout.log", "logs/stderr.log"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), key) {
			t.Errorf("%s holds the key: %s", name, b)
		}
	}
	if !strings.Contains(mustReadFile(t, filepath.Join(dir, "logs/stdout.log")), "my key is "+workerproto.Redacted) {
		t.Errorf("stdout.log lost the text around the key")
	}
	if st.Summary != "summary "+workerproto.Redacted || !strings.Contains(st.ErrorMessage, "stderr "+workerproto.Redacted) {
		t.Errorf("summary %q, error %q; want the key redacted", st.Summary, st.ErrorMessage)
	}
}
