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
// never blocks on the network; a goroutine of its own posts. A report goes
// out an interval after the first item it holds, and the next an interval
// after that at the soonest: what an agent does in less time than that
// (a short task, all of it) rides on the completion instead.
//
// Lifecycle: newProgressSender starts the poster; finish stops it, once
// a report in flight has been answered, and returns what is pending for
// the completion. add after finish does nothing.
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
		// The wait before a report is what bounds the rate.
		t := time.NewTimer(s.interval)
		select {
		case <-t.C:
		case <-s.stop:
			t.Stop()
			return
		}
		s.send(s.take())
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

// finish stops the poster, after the report in flight if there is one,
// and returns what is pending: the completion carries it, after every
// report.
func (s *progressSender) finish() []webhook.ProgressItem {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	close(s.stop)
	<-s.done
	return s.take()
}
