package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/strictjson"
	"github.com/corral-dev/corral/internal/task"
)

// ProgressPath is the server's HTTP path for worker progress reports; a
// unix:// webhook URL posts them here.
const ProgressPath = "/api/webhooks/worker-progress"

// MaxProgressItems bounds the items of one report.
const MaxProgressItems = 32

// ProgressItem is one thing the agent did (agent.Progress, bounded).
type ProgressItem struct {
	Kind   string `json:"kind"` // init, text, tool_use, tool_result, result
	Text   string `json:"text,omitempty"`
	Tool   string `json:"tool,omitempty"`
	Input  string `json:"input,omitempty"`
	Status string `json:"status,omitempty"` // ok or error, for tool_result
	// Coalesced counts the items of this kind dropped in favour of this one
	// since the previous report.
	Coalesced int `json:"coalesced,omitempty"`
}

// ProgressReport is the body of a progress webhook: what a worker's agent
// did since the previous report. It is signed with the task's key like a
// Completion, and carries its own webhook id and timestamp.
type ProgressReport struct {
	EventType string         `json:"event_type"` // always task.EventProgress
	Source    string         `json:"source"`
	TaskID    string         `json:"task_id"`
	Items     []ProgressItem `json:"items"`
	WebhookID string         `json:"webhook_id"`
	Timestamp int64          `json:"timestamp"`
}

// PostProgress signs p with key and POSTs it to ProgressPath at rawURL (a
// unix:// socket, or the completion URL of an http(s) server, whose path
// ends in Path). It makes one attempt bounded by opts.AttemptTimeout:
// progress is best-effort, and the next report follows within a second.
// Errors are classed as Post's.
func PostProgress(ctx context.Context, rawURL string, key []byte, p ProgressReport, opts PostOptions) error {
	opts.defaults()
	target, client, err := newClient(rawURL, opts.Client, opts.Dial)
	if err != nil {
		return err
	}
	if opts.Client == nil {
		defer client.CloseIdleConnections()
	}
	base, ok := strings.CutSuffix(target, Path)
	if !ok {
		return fmt.Errorf("post progress: webhook url %s does not end in %s: %w", redact(rawURL), Path, errdefs.ErrInvalidArgument)
	}
	p.EventType = task.EventProgress
	if p.Source == "" {
		p.Source = opts.Source
	}
	if p.WebhookID == "" {
		p.WebhookID = NewID()
	}
	p.Timestamp = opts.Now().Unix()
	body, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("encode progress: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, opts.AttemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+ProgressPath, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("build progress request: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderSignature, Sign(key, body))
	req.Header.Set(HeaderSource, p.Source)
	req.Header.Set(HeaderTimestamp, strconv.FormatInt(p.Timestamp, 10))
	req.Header.Set(HeaderID, p.WebhookID)
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("send progress: %v: %w", err, errdefs.ErrUnavailable)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 == 2 {
		return nil
	}
	return fmt.Errorf("post progress: server answered %s: %s: %w", resp.Status, strings.TrimSpace(string(msg)), statusClass(resp.StatusCode))
}

func statusClass(code int) error {
	switch {
	case code == http.StatusTooManyRequests:
		return errdefs.ErrResourceExhausted
	case code >= 500:
		return errdefs.ErrUnavailable
	case code == http.StatusUnauthorized:
		return errdefs.ErrUnauthenticated
	case code == http.StatusForbidden:
		return errdefs.ErrPermissionDenied
	case code == http.StatusNotFound:
		return errdefs.ErrNotFound
	case code == http.StatusConflict:
		return errdefs.ErrConflict
	default:
		return errdefs.ErrInvalidArgument
	}
}

// VerifyProgress authenticates a progress webhook and returns its body,
// with the checks and error classes of Verify: the signature under the
// task's derived key, the headers mirroring the body, the timestamp window
// and the webhook id never seen before (the task's replay set, shared with
// its completions). The caller bounds body.
//
// It then holds the report to the task's progress budget (progressLimits:
// a rate, and totals over the task's life): a report over it is dropped,
// counted, and refused with errdefs.ErrResourceExhausted, and the items
// returned carry a progress_dropped note when reports were dropped (at
// most one note per task in NoteEvery).
func (v *Verifier) VerifyProgress(m Signed) (ProgressReport, error) {
	sig, err := parseSignature(m.Signature)
	if err != nil {
		return ProgressReport{}, err
	}
	var p ProgressReport
	if err := strictjson.Decode(m.Body, &p); err != nil {
		return ProgressReport{}, fmt.Errorf("decode progress body: %w", err)
	}
	var bad []string
	if p.EventType != task.EventProgress {
		bad = append(bad, fmt.Sprintf("event_type %q is not %q", p.EventType, task.EventProgress))
	}
	if p.TaskID == "" {
		bad = append(bad, "task_id is empty")
	}
	if p.WebhookID == "" {
		bad = append(bad, "webhook_id is empty")
	}
	if p.Timestamp <= 0 {
		bad = append(bad, "timestamp is missing")
	}
	if len(p.Items) > MaxProgressItems {
		bad = append(bad, fmt.Sprintf("%d items, more than %d", len(p.Items), MaxProgressItems))
	}
	if len(bad) > 0 {
		return ProgressReport{}, fmt.Errorf("check progress body: %s: %w", strings.Join(bad, "; "), errdefs.ErrInvalidArgument)
	}
	now, err := v.authenticate(m, sig, "progress", envelope{p.TaskID, p.WebhookID, p.Source, p.Timestamp})
	if err != nil {
		return ProgressReport{}, err
	}
	err = v.remember(p.TaskID, p.WebhookID, now, func(st *taskState) (charge, error) {
		items, ch, err := st.progress.admit(v.limits, now, p.Items, len(m.Body))
		p.Items = items
		return ch, err
	})
	if err != nil {
		return ProgressReport{}, err
	}
	return p, nil
}
