package agent

import "bytes"

// lineSplitter cuts a byte stream into lines for fn, without the newline.
// A line longer than max is cut to its first max bytes and passed with
// long set; the rest of it is dropped, so memory stays bounded.
type lineSplitter struct {
	max  int
	fn   func(line []byte, long bool)
	buf  []byte
	long bool
}

func (l *lineSplitter) Write(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			l.add(p)
			return
		}
		l.add(p[:i])
		l.flush()
		p = p[i+1:]
	}
}

func (l *lineSplitter) add(p []byte) {
	if room := l.max - len(l.buf); len(p) > room {
		p = p[:max(room, 0)]
		l.long = true
	}
	l.buf = append(l.buf, p...)
}

// flush ends the current line, if any.
func (l *lineSplitter) flush() {
	line := bytes.TrimSuffix(l.buf, []byte("\r"))
	if len(line) > 0 || l.long {
		l.fn(line, l.long)
	}
	l.buf, l.long = l.buf[:0], false
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	n := len(p)
	if len(p) >= t.max {
		t.buf = append(t.buf[:0], p[len(p)-t.max:]...)
		return n, nil
	}
	if over := len(t.buf) + len(p) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

func (t *tailBuffer) String() string { return string(t.buf) }
