package config

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"os"

	"github.com/corral-dev/corral/internal/errdefs"
)

// maxSecretFileBytes bounds a secret file, so naming a large file by
// mistake fails rather than loading it. Keys and tokens are under 1 KiB.
const maxSecretFileBytes = 64 << 10

// Secrets are the credentials the configuration points at. Never log them.
type Secrets struct {
	// APIToken is the bearer token callers must present; "" when none is
	// configured (Validate then allows only a loopback listen address).
	APIToken string
	// WebhookSecret is the key worker completions are signed with; nil when
	// none is configured, and the server then keeps a generated key in the
	// data root.
	WebhookSecret []byte
	// NotifySecret signs outbound notifications; nil when
	// notify.secret_file is unset. NotifyPreviousSecret signs them too
	// during a rotation (notify.previous_secret_file).
	NotifySecret         []byte
	NotifyPreviousSecret []byte
	// APITokens are the named bearer tokens of api_tokens, in order.
	APITokens []NamedToken
	// StoreDSN is the PostgreSQL connection string of store.driver
	// postgres; "" for SQLite.
	StoreDSN string
	// EgressCredentials are the header values of egress.credentials, in
	// order: the secret under the rule's scheme.
	EgressCredentials []string
}

// NamedToken is one bearer token and the name events record for its caller.
type NamedToken struct {
	Name  string
	Token string
}

// Secrets reads the configured secrets. An environment variable
// (CORRAL_API_TOKEN, AI_WORKER_WEBHOOK_SECRET) wins over the matching
// *_file key, because the environment is the higher layer.
//
// A secret file is trimmed of surrounding white space and must be a
// non-empty regular file of at most 64 KiB that neither group nor others
// can read or write (mode 0600 or 0400): anything else is an error, not a
// warning, since a readable key lets any local user forge completions. For
// a Kubernetes secret volume, set defaultMode: 0400. Errors are
// *errdefs.FieldError naming the *_file key; a file that cannot be read
// also wraps its os error.
func (c *Config) Secrets() (Secrets, error) {
	var s Secrets
	switch {
	case c.apiToken != "":
		s.APIToken = c.apiToken
	case c.APITokenFile != "":
		b, err := readSecretFile(c.APITokenFile)
		if err != nil {
			return Secrets{}, &errdefs.FieldError{Field: c.field("api_token_file"), Err: err}
		}
		s.APIToken = string(b)
	}
	switch {
	case c.AIWorker.webhookSecret != "":
		s.WebhookSecret = []byte(c.AIWorker.webhookSecret)
	case c.AIWorker.WebhookSecretFile != "":
		b, err := readSecretFile(c.AIWorker.WebhookSecretFile)
		if err != nil {
			return Secrets{}, &errdefs.FieldError{Field: "ai_worker_config.webhook_secret_file", Err: err}
		}
		s.WebhookSecret = b
	}
	switch {
	case c.Store.dsn != "":
		s.StoreDSN = c.Store.dsn
	case c.Store.DSNFile != "":
		b, err := readSecretFile(c.Store.DSNFile)
		if err != nil {
			return Secrets{}, &errdefs.FieldError{Field: "store.dsn_file", Err: err}
		}
		s.StoreDSN = string(b)
	}
	seen := map[string]string{}
	if s.APIToken != "" {
		seen[s.APIToken] = "default"
	}
	for i, t := range c.APITokens {
		field := fmt.Sprintf("api_tokens[%d].token_file", i)
		b, err := readSecretFile(t.TokenFile)
		if err != nil {
			return Secrets{}, &errdefs.FieldError{Field: field, Err: err}
		}
		if other, ok := seen[string(b)]; ok {
			return Secrets{}, &errdefs.FieldError{Field: field, Err: fmt.Errorf("holds the same token as %s; each caller needs its own: %w", other, errdefs.ErrInvalidArgument)}
		}
		seen[string(b)] = t.Name
		s.APITokens = append(s.APITokens, NamedToken{Name: t.Name, Token: string(b)})
	}
	for i, ec := range c.Egress.Credentials {
		field := fmt.Sprintf("egress.credentials[%d].secret_file", i)
		secret := []byte(ec.fromEnv)
		if ec.SecretEnv != "" && ec.fromEnv == "" {
			return Secrets{}, &errdefs.FieldError{Field: fmt.Sprintf("egress.credentials[%d].secret_env", i), Err: fmt.Errorf("%s is not set in the server's environment: %w", ec.SecretEnv, errdefs.ErrInvalidArgument)}
		}
		if ec.SecretFile != "" {
			b, err := readSecretFile(ec.SecretFile)
			if err != nil {
				return Secrets{}, &errdefs.FieldError{Field: field, Err: err}
			}
			secret = b
		}
		switch ec.Scheme {
		case SchemeBearer:
			secret = append([]byte("Bearer "), secret...)
		case SchemeBasic:
			secret = []byte("Basic " + base64.StdEncoding.EncodeToString([]byte(ec.Username+":"+string(secret))))
		}
		if bytes.ContainsAny(secret, "\r\n\x00") {
			return Secrets{}, &errdefs.FieldError{Field: field, Err: fmt.Errorf("the secret spans lines: %w", errdefs.ErrInvalidArgument)}
		}
		s.EgressCredentials = append(s.EgressCredentials, string(secret))
	}
	if c.Notify.SecretFile != "" {
		b, err := readSecretFile(c.Notify.SecretFile)
		if err != nil {
			return Secrets{}, &errdefs.FieldError{Field: "notify.secret_file", Err: err}
		}
		s.NotifySecret = b
	}
	if c.Notify.PreviousSecretFile != "" {
		b, err := readSecretFile(c.Notify.PreviousSecretFile)
		if err != nil {
			return Secrets{}, &errdefs.FieldError{Field: "notify.previous_secret_file", Err: err}
		}
		s.NotifyPreviousSecret = b
	}
	return s, nil
}

// readSecretFile reads one secret file. It checks the mode of the file it
// opened, not of the path, so a swap between check and read cannot pass.
// Symbolic links are followed (Kubernetes secret volumes are links).
func readSecretFile(name string) ([]byte, error) {
	// Stat first only so that opening a FIFO cannot block; the check that
	// counts is on the opened file below.
	if fi, err := os.Stat(name); err == nil && !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("secret file %s is not a regular file", name)
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("open secret file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat secret file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("secret file %s is not a regular file", name)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("secret file %s is accessible by group or others (mode %04o); chmod 600 it: %w", name, perm, errdefs.ErrPermissionDenied)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read secret file: %w", err)
	}
	if len(b) > maxSecretFileBytes {
		return nil, fmt.Errorf("secret file %s is larger than %d bytes", name, maxSecretFileBytes)
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, fmt.Errorf("secret file %s is empty", name)
	}
	return b, nil
}
