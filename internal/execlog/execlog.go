// Package execlog keeps a session command's output on the server's disk,
// so that a client that drops, or a server that restarts, reads it again
// from where it was: every byte of the command's output (stdout and
// stderr interleaved as they came) has an offset, and a reader asks for
// the output from an offset on, following it until the command's end.
//
// A Log is a directory holding two files: out, the output as records
// (a 9-byte header, the stream and a length, then that many bytes of
// data; stream 0 is a gap of that length with no data: output the log
// never got, or dropped past its limit), and end.json, written once the
// command has ended. The log never holds more than its limit of data; the
// rest of the command's output is counted as gaps, so offsets stay true.
//
// Writers append in offset order; a chunk sent again (an agent resending
// after a reconnect what the server may have had) is cut to the part
// past the log's end. The files are written without fsync: they outlive a
// server killed with SIGKILL (the page cache holds them), not a machine
// that loses power, whose sandboxes end with it.
package execlog

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
)

// Streams of a Chunk.
const (
	Gap    = 0
	Stdout = 1
	Stderr = 2
)

const (
	outFile    = "out"
	endFile    = "end.json"
	headerSize = 9
)

// End is how the command ended, as its log keeps it. What it holds
// besides the byte counts is the caller's.
type End json.RawMessage

// Chunk is a part of the output from offset Offset: Data of stream Stream,
// or, for Gap, Len bytes the log does not have.
type Chunk struct {
	Stream int
	Offset int64
	Data   []byte
	Len    int64
}

// Log is one command's output. It is safe for concurrent use: one writer,
// any number of readers.
type Log struct {
	dir   string
	limit int64

	mu     sync.Mutex
	f      *os.File // open for appending; nil once ended or closed
	size   int64    // offsets written: data and gaps
	stored int64    // data bytes in out
	bytes  [3]int64 // per stream, gaps at 0
	end    []byte   // end.json's content, once ended
	grown  chan struct{}
}

// Create makes a new log in dir, which must not exist, keeping at most
// limit bytes of output.
func Create(dir string, limit int64) (*Log, error) {
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return nil, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, outFile), os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	return &Log{dir: dir, limit: limit, f: f, grown: make(chan struct{})}, nil
}

// Open opens the log in dir again (a restarted server's), to append to if
// it has not ended. A record cut short (a server killed mid-write) is
// cut off.
func Open(dir string, limit int64) (*Log, error) {
	l := &Log{dir: dir, limit: limit, grown: make(chan struct{})}
	f, err := os.OpenFile(filepath.Join(dir, outFile), os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	valid, err := l.scan(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Truncate(valid); err != nil {
		f.Close()
		return nil, err
	}
	if end, err := os.ReadFile(filepath.Join(dir, endFile)); err == nil {
		l.end = end
		f.Close()
		return l, nil
	}
	if _, err := f.Seek(valid, io.SeekStart); err != nil {
		f.Close()
		return nil, err
	}
	f.Close()
	if l.f, err = os.OpenFile(filepath.Join(dir, outFile), os.O_WRONLY|os.O_APPEND, 0); err != nil {
		return nil, err
	}
	return l, nil
}

// scan counts f's records and returns the length of its whole ones.
func (l *Log) scan(f *os.File) (int64, error) {
	br := bufio.NewReader(f)
	var pos int64
	var h [headerSize]byte
	for {
		if _, err := io.ReadFull(br, h[:]); err != nil {
			return pos, nil
		}
		kind, n := int(h[0]), int64(binary.BigEndian.Uint64(h[1:]))
		if !validKind(kind) || n < 0 {
			return 0, fmt.Errorf("exec log %s: a record of kind %d, length %d at %d", l.dir, kind, n, pos)
		}
		if kind == Stdout || kind == Stderr {
			if _, err := io.CopyN(io.Discard, br, n); err != nil {
				return pos, nil
			}
			pos += n
		}
		pos += headerSize
		l.count(kind, n)
	}
}

func validKind(k int) bool {
	return k == Gap || k == Stdout || k == Stderr || k == dropped|Stdout || k == dropped|Stderr
}

// Dir is the log's directory.
func (l *Log) Dir() string { return l.dir }

// Size is the offset the next byte of output will have.
func (l *Log) Size() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.size
}

// Bytes are the bytes of output stream (Stdout, Stderr) has had, kept
// or not; for Gap, the bytes the log does not have.
func (l *Log) Bytes(stream int) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bytes[stream]
}

// ErrEnded is an Append or End after the log's End.
var ErrEnded = errors.New("the command's log has ended")

// Append adds data of stream (Stdout or Stderr) at offset off. What the
// log has already is dropped; output before off that it never got is a
// gap. Past the limit, data is counted as a gap.
func (l *Log) Append(stream int, off int64, data []byte) error {
	if stream != Stdout && stream != Stderr {
		return fmt.Errorf("exec log: stream %d", stream)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return ErrEnded
	}
	if off < l.size {
		skip := min(l.size-off, int64(len(data)))
		data, off = data[skip:], off+skip
	}
	if len(data) == 0 {
		return nil
	}
	if off > l.size {
		if err := l.write(Gap, nil, off-l.size); err != nil {
			return err
		}
	}
	keep := min(int64(len(data)), max(l.limit-l.stored, 0))
	if keep > 0 {
		if err := l.write(stream, data[:keep], keep); err != nil {
			return err
		}
	}
	if rest := int64(len(data)) - keep; rest > 0 {
		// Past the limit: a gap, counted as the stream's output too.
		if err := l.write(dropped|stream, nil, rest); err != nil {
			return err
		}
	}
	l.wake()
	return nil
}

// dropped marks a gap record of output past the limit: the low bits
// are its stream.
const dropped = 0x80

// write appends one record (a kind: a stream, Gap, or dropped|stream);
// the caller holds mu.
func (l *Log) write(kind int, data []byte, n int64) error {
	buf := make([]byte, headerSize, headerSize+len(data))
	buf[0] = byte(kind)
	binary.BigEndian.PutUint64(buf[1:], uint64(n))
	buf = append(buf, data...)
	if _, err := l.f.Write(buf); err != nil {
		return fmt.Errorf("exec log: %w", err)
	}
	l.count(kind, n)
	return nil
}

// count adds a record of kind and length n to the totals.
func (l *Log) count(kind int, n int64) {
	l.size += n
	switch {
	case kind == Gap:
		l.bytes[Gap] += n
	case kind&dropped != 0:
		l.bytes[Gap] += n
		l.bytes[kind&^dropped] += n
	default:
		l.stored += n
		l.bytes[kind] += n
	}
}

func (l *Log) wake() {
	close(l.grown)
	l.grown = make(chan struct{})
}

// End records the command's end; output after it is refused.
func (l *Log) End(end any) error {
	b, err := json.Marshal(end)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return ErrEnded
	}
	tmp := filepath.Join(l.dir, "."+endFile)
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("exec log: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(l.dir, endFile)); err != nil {
		return fmt.Errorf("exec log: %w", err)
	}
	l.f.Close()
	l.f, l.end = nil, b
	l.wake()
	return nil
}

// Ended returns the end recorded (nil while the command runs).
func (l *Log) Ended() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.end
}

// Close closes the file a running command's log appends to; Open opens it
// again.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	l.wake()
	return err
}

// Read calls fn with the output from offset from on, in order, a chunk
// that straddles from cut to start there; with follow, it waits for more
// until the command has ended (or ctx ends), else it stops at the log's
// end. It returns the end (nil if the command has not ended).
func (l *Log) Read(ctx context.Context, from int64, follow bool, fn func(Chunk) error) ([]byte, error) {
	f, err := os.Open(filepath.Join(l.dir, outFile))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	br := bufio.NewReaderSize(f, 64<<10)
	var off int64 // the offset of the next record's first byte
	var h [headerSize]byte
	for {
		l.mu.Lock()
		size, end, grown, open := l.size, l.end, l.grown, l.f != nil
		l.mu.Unlock()
		for off < size {
			if _, err := io.ReadFull(br, h[:]); err != nil {
				return nil, fmt.Errorf("exec log %s: %w", l.dir, err)
			}
			kind, n := int(h[0]), int64(binary.BigEndian.Uint64(h[1:]))
			if !validKind(kind) {
				return nil, fmt.Errorf("exec log %s: a record of kind %d at offset %d", l.dir, kind, off)
			}
			c := Chunk{Stream: kind, Offset: off, Len: n}
			if kind&dropped != 0 {
				c.Stream = Gap
			}
			if c.Stream != Gap {
				c.Data = make([]byte, n)
				if _, err := io.ReadFull(br, c.Data); err != nil {
					return nil, fmt.Errorf("exec log %s: %w", l.dir, err)
				}
			}
			off += n
			if off <= from {
				continue
			}
			if c.Offset < from {
				cut := from - c.Offset
				c.Offset, c.Len = from, c.Len-cut
				if c.Data != nil {
					c.Data = c.Data[cut:]
				}
			}
			if err := fn(c); err != nil {
				return nil, err
			}
		}
		if end != nil {
			return end, nil
		}
		if !follow || !open {
			return nil, nil
		}
		select {
		case <-grown:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
