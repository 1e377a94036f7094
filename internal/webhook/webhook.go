// Package webhook signs, sends and verifies the completion webhook a worker
// POSTs to the server when its task ends (SPEC §6, seed 000 "Webhook
// Contract").
//
// Keys: the server holds one secret; each worker holds only DeriveKey(secret,
// taskID), so a worker can sign its own task's completion and nobody
// else's. The signature covers the whole body, and the body carries the
// webhook id and timestamp, so neither can be swapped; the X-Webhook-Id and
// X-Webhook-Timestamp headers only mirror them.
//
// The client side (Post) retries while the server is away; the server side
// (Verifier) checks the signature in constant time, the timestamp window and
// replays.
package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
)

// Headers of a completion webhook.
const (
	HeaderSignature = "X-Webhook-Signature"
	HeaderSource    = "X-Webhook-Source"
	HeaderTimestamp = "X-Webhook-Timestamp"
	HeaderID        = "X-Webhook-Id"
)

// Signed is a worker message as it arrived: its body and the headers that
// sign and describe it. Verify and VerifyProgress take it.
type Signed struct {
	Signature, ID, Timestamp, Source string
	Body                             []byte
}

// Received is the worker message of an HTTP request with header h and
// body.
func Received(h http.Header, body []byte) Signed {
	return Signed{
		Signature: h.Get(HeaderSignature),
		ID:        h.Get(HeaderID),
		Timestamp: h.Get(HeaderTimestamp),
		Source:    h.Get(HeaderSource),
		Body:      body,
	}
}

// Path is the server's HTTP path for worker completions; a unix:// webhook
// URL is always posted here.
const Path = "/api/webhooks/worker-complete"

// EventWorkerCompleted is the event_type of a Completion.
const EventWorkerCompleted = "worker_completed"

// MaxBodyBytes is the largest completion body the server should read; the
// caller of Verify enforces it (http.MaxBytesReader). 1 MiB holds about
// 10,000 output file names.
const MaxBodyBytes = 1 << 20

// keyContext separates webhook keys from any other use of the secret, and
// versions the derivation.
const keyContext = "corral worker webhook v1\x00"

// DeriveKey returns the key a worker uses to sign task taskID's completion:
// HMAC-SHA256(secret, "corral worker webhook v1\x00"+taskID).
func DeriveKey(secret []byte, taskID string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(keyContext + taskID))
	return m.Sum(nil)
}

// Sign returns the X-Webhook-Signature value for body: "sha256=" and the hex
// HMAC-SHA256 of body under key.
func Sign(key, body []byte) string {
	return "sha256=" + hex.EncodeToString(mac(key, body))
}

func mac(key, body []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(body)
	return m.Sum(nil)
}

// Completion is the body of a completion webhook: the seed's payload plus
// webhook_id and timestamp, which are signed with the rest.
type Completion struct {
	EventType       string   `json:"event_type"` // always EventWorkerCompleted
	Source          string   `json:"source"`     // "local", "docker", "kubernetes", ...
	TaskID          string   `json:"task_id"`
	Status          string   `json:"status"` // "success", "failed", "timeout", "cancelled"
	DurationSeconds float64  `json:"duration_seconds"`
	ExitCode        int      `json:"exit_code"`
	OutputFiles     []string `json:"output_files"`  // names relative to output/
	ErrorMessage    string   `json:"error_message"` // "" is sent as null
	// SessionID is the agent's session, for a follow-up to resume.
	SessionID string `json:"session_id,omitempty"`
	// Progress is what the agent did since the worker's last progress
	// report (at most MaxProgressItems): the server records it before the
	// completion, in the same commit, instead of one more report's round
	// trip and commit at the end of every task.
	Progress []ProgressItem `json:"progress,omitempty"`
	// WebhookID is the same for every attempt to deliver one completion, so
	// the server can tell a retry from a new message. Post fills it when
	// empty.
	WebhookID string `json:"webhook_id"`
	// Timestamp is when this attempt was signed, in Unix seconds. Post sets
	// it on every attempt.
	Timestamp int64 `json:"timestamp"`
}

// MarshalJSON writes an empty ErrorMessage as null and nil OutputFiles as
// [], as the seed's payload does.
func (c Completion) MarshalJSON() ([]byte, error) {
	type plain Completion
	out := struct {
		plain
		OutputFiles  []string `json:"output_files"`
		ErrorMessage *string  `json:"error_message"`
	}{plain: plain(c), OutputFiles: c.OutputFiles}
	if out.OutputFiles == nil {
		out.OutputFiles = []string{}
	}
	if c.ErrorMessage != "" {
		out.ErrorMessage = &c.ErrorMessage
	}
	return json.Marshal(out)
}
