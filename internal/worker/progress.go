package worker

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/corral-dev/corral/internal/agent"
	"github.com/corral-dev/corral/internal/webhook"
)

const (
	// DefaultProgressInterval is the least time between two progress
	// reports. Each report holds at most one item of each kind, so the
	// server records at most one task_progress event per kind per interval
	// however chatty the agent is: five kinds at 500 ms is 10 events a
	// second at most, against the hundreds of stream lines an agent can
	// print in that time.
	DefaultProgressInterval = 500 * time.Millisecond
	// progressTextBytes bounds the text of one progress item.
	progressTextBytes = 512
	// progressTimeout bounds one progress POST: progress is best-effort.
	progressTimeout = 2 * time.Second
)

// progressSender coalesces an agent's progress items and posts them as
// signed reports. add is called from the goroutine that parses stdout and
// never blocks on the network; a goroutine of its own posts.
//
// Lifecycle: newProgressSender starts the poster; close flushes what is
// pending (one last report) and stops it. add after close does nothing.
type progressSender struct {
	post     func(ctx context.Context, items []webhook.ProgressItem) error
	interval time.Duration
	redact   func(string) string
	log      *slog.Logger

	mu      sync.Mutex
	pending []webhook.ProgressItem // at most one per kind, in arrival order
	closed  bool
	wake    chan struct{}
	stop    chan struct{}
	done    chan struct{}
}

func newProgressSender(interval time.Duration, redact func(string) string, post func(context.Context, []webhook.ProgressItem) error, log *slog.Logger) *progressSender {
	s := &progressSender{
		post: post, interval: interval, redact: redact, log: log,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
	go s.run()
	return s
}

// add queues p, replacing a pending item of the same kind.
func (s *progressSender) add(p agent.Progress) {
	it := webhook.ProgressItem{
		Kind:   p.Kind,
		Text:   agent.Truncate(s.redact(p.Text), progressTextBytes),
		Tool:   s.redact(p.Tool),
		Input:  s.redact(p.Input),
		Status: p.Status,
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	replaced := false
	for i := range s.pending {
		if s.pending[i].Kind == it.Kind {
			it.Coalesced = s.pending[i].Coalesced + 1
			s.pending[i] = it
			replaced = true
			break
		}
	}
	if !replaced && len(s.pending) < webhook.MaxProgressItems {
		s.pending = append(s.pending, it)
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *progressSender) take() []webhook.ProgressItem {
	s.mu.Lock()
	defer s.mu.Unlock()
	items := s.pending
	s.pending = nil
	return items
}

func (s *progressSender) run() {
	defer close(s.done)
	for {
		select {
		case <-s.wake:
		case <-s.stop:
			return
		}
		s.send(s.take())
		// The pause after a report is what bounds the rate.
		t := time.NewTimer(s.interval)
		select {
		case <-t.C:
		case <-s.stop:
			t.Stop()
			return
		}
	}
}

func (s *progressSender) send(items []webhook.ProgressItem) {
	if len(items) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), progressTimeout)
	defer cancel()
	if err := s.post(ctx, items); err != nil {
		s.log.Debug("progress not delivered", "items", len(items), "err", err)
	}
}

// close stops the poster and sends what is pending.
func (s *progressSender) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.mu.Unlock()
	close(s.stop)
	<-s.done
	s.send(s.take())
}
