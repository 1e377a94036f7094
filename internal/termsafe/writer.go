package termsafe

import (
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Writer escapes a stream as Text does and writes it to an underlying
// writer. A UTF-8 sequence or a "\r\n" split between two writes is seen
// whole; Close writes what an unfinished one left, escaped.
type Writer struct {
	w    io.Writer
	tail []byte // the end of the last write (an incomplete UTF-8 sequence or a \r), waiting for the next one
	buf  []byte
}

// NewWriter returns a Writer that writes escaped text to w.
func NewWriter(w io.Writer) *Writer {
	return &Writer{w: w}
}

// Write escapes p and writes it on.
func (w *Writer) Write(p []byte) (int, error) {
	return len(p), w.write(p, false)
}

// Close writes the end of the stream held back by the last Write. It does
// not close the underlying writer.
func (w *Writer) Close() error {
	return w.write(nil, true)
}

func (w *Writer) write(p []byte, final bool) error {
	in := p
	if len(w.tail) > 0 {
		in = append(w.tail, p...)
	}
	out, n := appendSafe(w.buf[:0], in, true, final)
	w.buf = out
	w.tail = append(w.tail[:0], in[n:]...)
	if len(out) == 0 {
		return nil
	}
	_, err := w.w.Write(out)
	return err
}

// IsTerminal reports whether w is a terminal.
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// ForTerminal returns w as is when it is not a terminal, so that a file's
// bytes reach a pipe or a file exactly, and a Writer on w when it is. The
// caller closes what it returns to flush it.
func ForTerminal(w io.Writer) io.WriteCloser {
	if IsTerminal(w) {
		return NewWriter(w)
	}
	return nopCloser{w}
}

// nopCloser is a writer whose Close does nothing.
type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }
