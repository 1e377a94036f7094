package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

// MustWriteSecret writes content to a file with mode perm in a temporary
// directory and returns its path.
func MustWriteSecret(tb testing.TB, content string, perm os.FileMode) string {
	tb.Helper()
	p := filepath.Join(tb.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.Chmod(p, perm); err != nil { // not subject to the umask
		tb.Fatal(err)
	}
	return p
}

func TestSecretsFromFiles(t *testing.T) {
	c := Default()
	c.APITokenFile = MustWriteSecret(t, "  api-token\n", 0o600)
	c.AIWorker.WebhookSecretFile = MustWriteSecret(t, "webhook-key\n\n", 0o400)
	c.Notify.SecretFile = MustWriteSecret(t, "\tnotify-key ", 0o600)
	s, err := c.Secrets()
	if err != nil {
		t.Fatal(err)
	}
	if s.APIToken != "api-token" || string(s.WebhookSecret) != "webhook-key" || string(s.NotifySecret) != "notify-key" {
		t.Errorf("Secrets() = %q %q %q, want trimmed file contents", s.APIToken, s.WebhookSecret, s.NotifySecret)
	}
}

func TestSecretsNoneConfigured(t *testing.T) {
	s, err := Default().Secrets()
	if err != nil {
		t.Fatal(err)
	}
	if s.APIToken != "" || s.WebhookSecret != nil || s.NotifySecret != nil {
		t.Errorf("Secrets() = %+v, want none", s)
	}
}

// TestSecretsEnvWins checks that the environment, the higher layer, wins
// over a *_file key set in the file.
func TestSecretsEnvWins(t *testing.T) {
	tok := MustWriteSecret(t, "from-file", 0o600)
	key := MustWriteSecret(t, "key-from-file", 0o600)
	c := MustLoad(t, "api_token_file: "+tok+"\nai_worker_config: {webhook_secret_file: "+key+"}\n",
		"CORRAL_API_TOKEN=from-env", "AI_WORKER_WEBHOOK_SECRET=key-from-env")
	s, err := c.Secrets()
	if err != nil {
		t.Fatal(err)
	}
	if s.APIToken != "from-env" || string(s.WebhookSecret) != "key-from-env" {
		t.Errorf("Secrets() = %q %q, want the environment's", s.APIToken, s.WebhookSecret)
	}

	c = MustLoad(t, "api_token_file: "+tok+"\nai_worker_config: {webhook_secret_file: "+key+"}\n")
	if s, err = c.Secrets(); err != nil {
		t.Fatal(err)
	}
	if s.APIToken != "from-file" || string(s.WebhookSecret) != "key-from-file" {
		t.Errorf("Secrets() = %q %q, want the files'", s.APIToken, s.WebhookSecret)
	}
}

func TestSecretsErrors(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		edit  func(*Config)
		field string
		msg   string
		is    error
	}{
		{"world readable", func(c *Config) { c.APITokenFile = MustWriteSecret(t, "x", 0o644) }, "api_token_file", "accessible by group or others (mode 0644); chmod 600", errdefs.ErrPermissionDenied},
		{"group readable", func(c *Config) { c.AIWorker.WebhookSecretFile = MustWriteSecret(t, "x", 0o640) }, "ai_worker_config.webhook_secret_file", "mode 0640", errdefs.ErrPermissionDenied},
		{"group writable", func(c *Config) { c.Notify.SecretFile = MustWriteSecret(t, "x", 0o620) }, "notify.secret_file", "mode 0620", errdefs.ErrPermissionDenied},
		{"empty", func(c *Config) { c.APITokenFile = MustWriteSecret(t, " \n\t", 0o600) }, "api_token_file", "is empty", nil},
		{"too large", func(c *Config) { c.APITokenFile = MustWriteSecret(t, strings.Repeat("x", 64<<10+1), 0o600) }, "api_token_file", "larger than 65536 bytes", nil},
		{"missing", func(c *Config) { c.APITokenFile = filepath.Join(dir, "nope") }, "api_token_file", "open secret file", fs.ErrNotExist},
		{"directory", func(c *Config) { c.APITokenFile = dir }, "api_token_file", "not a regular file", nil},
		{"fifo", func(c *Config) { c.APITokenFile = fifo }, "api_token_file", "not a regular file", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Default()
			tt.edit(c)
			_, err := c.Secrets()
			wantFieldError(t, err, tt.field, tt.msg)
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %v is not %v", err, tt.is)
			}
		})
	}
}

// TestSecretsFollowsSymlink covers Kubernetes secret volumes, whose files
// are links; the mode that counts is the target's.
func TestSecretsFollowsSymlink(t *testing.T) {
	target := MustWriteSecret(t, "linked", 0o400)
	link := filepath.Join(t.TempDir(), "token")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	c := Default()
	c.APITokenFile = link
	s, err := c.Secrets()
	if err != nil || s.APIToken != "linked" {
		t.Errorf("Secrets() = %q, %v; want the link target's content", s.APIToken, err)
	}
}

func TestNamedTokens(t *testing.T) {
	c := MustLoad(t, "api_tokens:\n  - name: assistant\n    token_file: "+MustWriteSecret(t, "tok-a\n", 0o600)+"\n  - {name: ci, token_file: "+MustWriteSecret(t, "tok-b", 0o400)+"}\n", "CORRAL_API_TOKEN=tok-default")
	s, err := c.Secrets()
	if err != nil {
		t.Fatal(err)
	}
	want := []NamedToken{{Name: "assistant", Token: "tok-a"}, {Name: "ci", Token: "tok-b"}}
	if len(s.APITokens) != 2 || s.APITokens[0] != want[0] || s.APITokens[1] != want[1] || s.APIToken != "tok-default" {
		t.Errorf("Secrets() = %q %+v, want the default token and %+v", s.APIToken, s.APITokens, want)
	}

	c = MustLoad(t, "api_tokens: [{name: a, token_file: "+MustWriteSecret(t, "same", 0o600)+"}]\n", "CORRAL_API_TOKEN=same")
	if _, err := c.Secrets(); err == nil || !strings.Contains(err.Error(), "api_tokens[0].token_file") || !strings.Contains(err.Error(), "same token as default") {
		t.Errorf("Secrets() with a token used twice = %v", err)
	}
	c = MustLoad(t, "api_tokens: [{name: a, token_file: "+MustWriteSecret(t, "x", 0o644)+"}]\n")
	if _, err := c.Secrets(); err == nil || !strings.Contains(err.Error(), "api_tokens[0].token_file") {
		t.Errorf("Secrets() with a readable token file = %v", err)
	}
}

// The store's connection string is a secret: from CORRAL_STORE_DSN, which
// wins, or from store.dsn_file, held to the secret files' rules.
func TestStoreDSN(t *testing.T) {
	dsn := MustWriteSecret(t, "host=/run/postgresql dbname=corral password=from-file\n", 0o600)
	c := MustLoad(t, "store: {driver: postgres, dsn_file: "+dsn+"}\n")
	s, err := c.Secrets()
	if err != nil || s.StoreDSN != "host=/run/postgresql dbname=corral password=from-file" {
		t.Errorf("Secrets() StoreDSN %q, %v; want the file's", s.StoreDSN, err)
	}
	c = MustLoad(t, "store: {driver: postgres, dsn_file: "+dsn+"}\n", "CORRAL_STORE_DSN=host=db password=from-env")
	if s, err = c.Secrets(); err != nil || s.StoreDSN != "host=db password=from-env" {
		t.Errorf("Secrets() StoreDSN %q, %v; want the environment's", s.StoreDSN, err)
	}
	c = MustLoad(t, "store: {driver: postgres, dsn_file: "+MustWriteSecret(t, "host=db", 0o644)+"}\n")
	if _, err := c.Secrets(); err == nil || !strings.Contains(err.Error(), "store.dsn_file") {
		t.Errorf("a DSN file others can read: %v, want an error naming store.dsn_file", err)
	}
}

// TestSecretsOfCredentialRules: a rule's secret comes from its file or
// from the server's environment, shaped by its scheme; an unset variable
// is an error naming it, never a value.
func TestSecretsOfCredentialRules(t *testing.T) {
	tok := MustWriteSecret(t, "file-token", 0o600)
	c := MustLoad(t, `egress:
  credentials:
    - {name: raw, host: a.example, header: Private-Token, secret_file: `+tok+`}
    - {name: bearer, host: b.example, scheme: bearer, secret_env: B_TOKEN}
    - {name: basic, host: c.example, scheme: basic, username: x-access-token, secret_env: C_TOKEN}
`, "B_TOKEN=env-token", "C_TOKEN=c-token")
	s, err := c.Secrets()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"file-token", "Bearer env-token", "Basic eC1hY2Nlc3MtdG9rZW46Yy10b2tlbg=="}
	if !slices.Equal(s.EgressCredentials, want) {
		t.Errorf("EgressCredentials = %q, want %q", s.EgressCredentials, want)
	}
	c = MustLoad(t, "egress: {credentials: [{name: b, host: b.example, secret_env: B_TOKEN}]}\n")
	if _, err := c.Secrets(); err == nil || !strings.Contains(err.Error(), "B_TOKEN is not set") || !strings.Contains(err.Error(), "egress.credentials[0].secret_env") {
		t.Errorf("an unset variable: %v", err)
	}
}
