package notify

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// The Standard Webhooks headers every notification carries.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// SecretPrefix starts a Standard Webhooks secret: "whsec_" and the key in
// base64.
const SecretPrefix = "whsec_"

// MinSecretBytes is the shortest key NewSigner accepts; the Standard
// Webhooks specification asks for 24 to 64 bytes.
const MinSecretBytes = 24

// Signer signs notifications with a Standard Webhooks secret, and during a
// rotation with the one before it too: each message then carries both
// signatures, so a receiver holding either secret accepts it. It is safe
// for concurrent use.
type Signer struct {
	key      []byte
	previous [][]byte
}

// NewSigner returns a Signer for secret, "whsec_" followed by the key in
// standard base64 (padding optional), signing with the previous secrets
// too. Each key is at least MinSecretBytes long. Errors wrap
// errdefs.ErrInvalidArgument and never echo a secret.
func NewSigner(secret string, previous ...string) (*Signer, error) {
	key, err := parseSecret(secret)
	if err != nil {
		return nil, err
	}
	s := &Signer{key: key}
	for _, p := range previous {
		k, err := parseSecret(p)
		if err != nil {
			return nil, fmt.Errorf("the previous %w", err)
		}
		s.previous = append(s.previous, k)
	}
	return s, nil
}

// parseSecret reads a whsec_ secret's key.
func parseSecret(secret string) ([]byte, error) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(secret), SecretPrefix)
	if !ok {
		return nil, fmt.Errorf("notification secret must start with %s followed by base64: %w", SecretPrefix, errdefs.ErrInvalidArgument)
	}
	key, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(rest, "="))
	if err != nil {
		return nil, fmt.Errorf("notification secret after %s is not base64: %w", SecretPrefix, errdefs.ErrInvalidArgument)
	}
	if len(key) < MinSecretBytes {
		return nil, fmt.Errorf("notification secret is %d bytes, want at least %d: %w", len(key), MinSecretBytes, errdefs.ErrInvalidArgument)
	}
	return key, nil
}

// NewSecret returns a fresh secret of 32 random bytes in the whsec_ form.
func NewSecret() string {
	b := make([]byte, 32)
	rand.Read(b)
	return SecretPrefix + base64.StdEncoding.EncodeToString(b)
}

// Sign returns the webhook-signature value for one message: "v1," and the
// base64 HMAC-SHA256 of id + "." + unix seconds + "." + body, under the
// secret and then each previous one, space-separated.
func (s *Signer) Sign(id string, ts time.Time, body []byte) string {
	sigs := []string{"v1," + base64.StdEncoding.EncodeToString(mac(s.key, id, ts.Unix(), body))}
	for _, k := range s.previous {
		sigs = append(sigs, "v1,"+base64.StdEncoding.EncodeToString(mac(k, id, ts.Unix(), body)))
	}
	return strings.Join(sigs, " ")
}

func mac(key []byte, id string, unix int64, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + strconv.FormatInt(unix, 10) + "."))
	m.Write(body)
	return m.Sum(nil)
}

// SetHeaders sets the three Standard Webhooks headers on h.
func (s *Signer) SetHeaders(h http.Header, id string, ts time.Time, body []byte) {
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(HeaderSignature, s.Sign(id, ts, body))
}

// Verify checks a received notification as a Standard Webhooks receiver
// does: the three headers are present, the timestamp is within tolerance
// of now, and one of the space-separated v1 signatures matches (compared
// in constant time). Errors wrap errdefs.ErrUnauthenticated. Corral sends
// notifications and does not receive them; Verify is for tests and for Go
// hosts.
func (s *Signer) Verify(h http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	id, tsv, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || tsv == "" || sigs == "" {
		return fmt.Errorf("missing %s, %s or %s: %w", HeaderID, HeaderTimestamp, HeaderSignature, errdefs.ErrUnauthenticated)
	}
	unix, err := strconv.ParseInt(tsv, 10, 64)
	if err != nil {
		return fmt.Errorf("%s %q is not unix seconds: %w", HeaderTimestamp, tsv, errdefs.ErrUnauthenticated)
	}
	if d := now.Sub(time.Unix(unix, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%s is %s away from now: %w", HeaderTimestamp, d.Round(time.Second), errdefs.ErrUnauthenticated)
	}
	want := mac(s.key, id, unix, body)
	for _, sig := range strings.Fields(sigs) {
		v, b64, ok := strings.Cut(sig, ",")
		if !ok || v != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(b64)
		if err == nil && hmac.Equal(got, want) {
			return nil
		}
	}
	return fmt.Errorf("no matching %s: %w", HeaderSignature, errdefs.ErrUnauthenticated)
}
