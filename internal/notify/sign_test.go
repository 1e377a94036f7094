package notify

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/corral-dev/corral/internal/errdefs"
)

// The Standard Webhooks published test vector (standard-webhooks
// libraries' signing test).
const (
	vectorSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vectorID     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	vectorUnix   = 1614265330
	vectorBody   = `{"test": 2432232314}`
	vectorSig    = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

func TestSignerStandardWebhooksVector(t *testing.T) {
	s, err := NewSigner(vectorSecret)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Sign(vectorID, time.Unix(vectorUnix, 0), []byte(vectorBody)); got != vectorSig {
		t.Errorf("Sign = %s, want %s", got, vectorSig)
	}
	h := http.Header{}
	s.SetHeaders(h, vectorID, time.Unix(vectorUnix, 0), []byte(vectorBody))
	if h.Get("webhook-id") != vectorID || h.Get("webhook-timestamp") != "1614265330" || h.Get("webhook-signature") != vectorSig {
		t.Errorf("headers = %v", h)
	}
}

func TestNewSignerRejects(t *testing.T) {
	for _, tc := range []struct{ name, secret, want string }{
		{"no prefix", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "must start with whsec_"},
		{"not base64", "whsec_!!!notbase64!!!", "not base64"},
		{"short", "whsec_c2hvcnQ=", "is 5 bytes, want at least 24"},
		{"empty", "", "must start with whsec_"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewSigner(tc.secret)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("NewSigner(%q) = %v, want an invalid-argument error containing %q", tc.secret, err, tc.want)
			}
			if err != nil && tc.secret != "" && strings.Contains(err.Error(), strings.TrimPrefix(tc.secret, "whsec_")) {
				t.Errorf("error %q echoes the secret", err)
			}
		})
	}
	// Padding is optional, and surrounding white space (a file's newline) is ignored.
	for _, s := range []string{vectorSecret, vectorSecret + "\n", NewSecret(), strings.TrimRight(NewSecret(), "=")} {
		if _, err := NewSigner(s); err != nil {
			t.Errorf("NewSigner(a valid secret) = %v", err)
		}
	}
}

func TestVerify(t *testing.T) {
	s, err := NewSigner(vectorSecret)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(vectorUnix, 0)
	body := []byte(vectorBody)
	signed := func() http.Header {
		h := http.Header{}
		s.SetHeaders(h, vectorID, now, body)
		return h
	}
	if err := s.Verify(signed(), body, now.Add(4*time.Minute), 5*time.Minute); err != nil {
		t.Errorf("Verify(valid) = %v", err)
	}
	multi := signed()
	multi.Set("webhook-signature", "v2,abc v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= "+multi.Get("webhook-signature"))
	if err := s.Verify(multi, body, now, 5*time.Minute); err != nil {
		t.Errorf("Verify(several signatures, one valid) = %v", err)
	}
	other, _ := NewSigner(NewSecret())
	for name, tc := range map[string]struct {
		h    http.Header
		body string
		at   time.Time
		s    *Signer
	}{
		"tampered body": {signed(), `{"test": 2432232315}`, now, s},
		"old":           {signed(), vectorBody, now.Add(5*time.Minute + time.Second), s},
		"new":           {signed(), vectorBody, now.Add(-5*time.Minute - time.Second), s},
		"other key":     {signed(), vectorBody, now, other},
		"no id":         {func() http.Header { h := signed(); h.Del("webhook-id"); return h }(), vectorBody, now, s},
		"other id":      {func() http.Header { h := signed(); h.Set("webhook-id", "msg_2"); return h }(), vectorBody, now, s},
		"v2 only": {func() http.Header {
			h := signed()
			h.Set("webhook-signature", "v2"+h.Get("webhook-signature")[2:])
			return h
		}(), vectorBody, now, s},
	} {
		if err := tc.s.Verify(tc.h, []byte(tc.body), tc.at, 5*time.Minute); !errors.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("%s: Verify = %v, want ErrUnauthenticated", name, err)
		}
	}
}

func TestBackoffBounds(t *testing.T) {
	initial, ceiling := time.Second, time.Hour
	prevLow := time.Duration(0)
	for n := 1; n <= 40; n++ {
		d := initial << (n - 1)
		if n > 20 || d > ceiling {
			d = ceiling
		}
		low, high := Backoff(initial, ceiling, n, 0), Backoff(initial, ceiling, n, 0.999999)
		if low != d/2 {
			t.Errorf("attempt %d: shortest wait %s, want %s", n, low, d/2)
		}
		if high >= d || high < d-d/1000 {
			t.Errorf("attempt %d: longest wait %s, want just under %s", n, high, d)
		}
		if low < prevLow {
			t.Errorf("attempt %d: shortest wait %s fell below the previous %s", n, low, prevLow)
		}
		prevLow = low
	}
	if got := Backoff(time.Second, time.Hour, 1000, 0.5); got > time.Hour {
		t.Errorf("Backoff after 1000 attempts = %s, over the ceiling", got)
	}
}

// TestRotation: a signer with the previous secret signs each message under
// both, so a receiver holding either accepts it, and one holding neither
// does not.
func TestRotation(t *testing.T) {
	oldSecret, newSecret := NewSecret(), NewSecret()
	s, err := NewSigner(newSecret, oldSecret)
	if err != nil {
		t.Fatal(err)
	}
	body, now := []byte(`{"type":"worker_completed"}`), time.Now()
	h := http.Header{}
	s.SetHeaders(h, "msg_1", now, body)
	if n := len(strings.Fields(h.Get(HeaderSignature))); n != 2 {
		t.Fatalf("%d signatures, want 2: %s", n, h.Get(HeaderSignature))
	}
	for name, secret := range map[string]string{"the new secret": newSecret, "the old secret": oldSecret} {
		r, _ := NewSigner(secret)
		if err := r.Verify(h, body, now, time.Minute); err != nil {
			t.Errorf("a receiver with %s: %v", name, err)
		}
	}
	other, _ := NewSigner(NewSecret())
	if err := other.Verify(h, body, now, time.Minute); err == nil {
		t.Error("a receiver with neither secret accepted it")
	}
	if _, err := NewSigner(newSecret, "whsec_short"); err == nil || strings.Contains(err.Error(), "short") {
		t.Errorf("a bad previous secret: %v", err)
	}
}
