package task

import "sync"

// Writers records who writes each named workspace (projects/<name>/): one
// task or session at a time. The scheduler and the session manager share
// one. It is safe for concurrent use; the zero value is ready.
type Writers struct {
	mu sync.Mutex
	by map[string]string
}

// Acquire makes who the writer of workspace name if it has none (or is
// who already) and reports true; otherwise it returns the holder and false.
func (w *Writers) Acquire(name, who string) (holder string, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if h, held := w.by[name]; held && h != who {
		return h, false
	}
	if w.by == nil {
		w.by = map[string]string{}
	}
	w.by[name] = who
	return who, true
}

// Release ends who's hold on workspace name; another's hold stays.
func (w *Writers) Release(name, who string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.by[name] == who {
		delete(w.by, name)
	}
}
