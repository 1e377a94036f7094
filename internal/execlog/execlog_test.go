package execlog

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// readAll reads l from from, without following: the bytes with gaps as
// '?', and the end.
func readAll(t *testing.T, l *Log, from int64) (string, []byte) {
	t.Helper()
	var b bytes.Buffer
	next := from
	end, err := l.Read(context.Background(), from, false, func(c Chunk) error {
		if c.Offset != next {
			t.Fatalf("chunk at %d, want %d", c.Offset, next)
		}
		if c.Stream == Gap {
			b.Write(bytes.Repeat([]byte("?"), int(c.Len)))
		} else {
			b.Write(c.Data)
		}
		next += c.Len
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String(), end
}

// TestAppendReadsBackFromAnyOffset: chunks sent again are kept once,
// output the log never got is a gap, and a read from any offset gets the
// rest exactly once, in order.
func TestAppendReadsBackFromAnyOffset(t *testing.T) {
	l, err := Create(filepath.Join(t.TempDir(), "e1"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(l.Append(Stdout, 0, []byte("hello ")))
	must(l.Append(Stderr, 6, []byte("warn ")))
	must(l.Append(Stdout, 3, []byte("lo warn world"))) // resent from 3: only "world" is new
	must(l.Append(Stdout, 17, []byte("!")))            // 1 byte never came
	want := "hello warn world?!"
	for from := int64(0); from <= int64(len(want)); from++ {
		if got, _ := readAll(t, l, from); got != want[from:] {
			t.Errorf("from %d: %q, want %q", from, got, want[from:])
		}
	}
	if l.Bytes(Stdout) != 12 || l.Bytes(Stderr) != 5 || l.Bytes(Gap) != 1 || l.Size() != 18 {
		t.Errorf("bytes: stdout %d stderr %d gaps %d size %d", l.Bytes(Stdout), l.Bytes(Stderr), l.Bytes(Gap), l.Size())
	}
	must(l.End(map[string]int{"exit_code": 3}))
	if err := l.Append(Stdout, 18, []byte("late")); err != ErrEnded {
		t.Errorf("append after the end: %v", err)
	}
	if _, end := readAll(t, l, 0); string(end) != `{"exit_code":3}` {
		t.Errorf("end %s", end)
	}
}

// TestLimit: past its limit the log keeps counting, as gaps.
func TestLimit(t *testing.T) {
	l, err := Create(filepath.Join(t.TempDir(), "e1"), 4)
	if err != nil {
		t.Fatal(err)
	}
	l.Append(Stdout, 0, []byte("abcdef"))
	l.Append(Stderr, 6, []byte("gh"))
	if got, _ := readAll(t, l, 0); got != "abcd????" {
		t.Errorf("read %q", got)
	}
	if l.Bytes(Stdout) != 6 || l.Bytes(Stderr) != 2 || l.Bytes(Gap) != 4 {
		t.Errorf("bytes: stdout %d stderr %d gaps %d", l.Bytes(Stdout), l.Bytes(Stderr), l.Bytes(Gap))
	}
	fi, _ := os.Stat(filepath.Join(l.Dir(), outFile))
	if fi.Size() > 4+3*headerSize {
		t.Errorf("out is %d bytes for 4 kept", fi.Size())
	}
}

// TestFollow: a reader that follows gets what comes after it started, and
// returns with the end.
func TestFollow(t *testing.T) {
	l, err := Create(filepath.Join(t.TempDir(), "e1"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	l.Append(Stdout, 0, []byte("a"))
	got := make(chan string, 10)
	done := make(chan []byte, 1)
	go func() {
		end, err := l.Read(context.Background(), 0, true, func(c Chunk) error { got <- string(c.Data); return nil })
		if err != nil {
			t.Error(err)
		}
		done <- end
	}()
	if s := <-got; s != "a" {
		t.Fatalf("first %q", s)
	}
	l.Append(Stdout, 1, []byte("b"))
	select {
	case s := <-got:
		if s != "b" {
			t.Fatalf("second %q", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the follower was not woken")
	}
	l.End("x")
	if end := <-done; string(end) != `"x"` {
		t.Errorf("end %s", end)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l2, _ := Create(filepath.Join(t.TempDir(), "e2"), 10)
	if _, err := l2.Read(ctx, 0, true, func(Chunk) error { return nil }); err != context.Canceled {
		t.Errorf("a follow whose context ended: %v", err)
	}
}

// TestOpenAfterACrash: a log opened again has its totals, drops a record
// cut short, and appends on.
func TestOpenAfterACrash(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "e1")
	l, err := Create(dir, 5)
	if err != nil {
		t.Fatal(err)
	}
	l.Append(Stdout, 0, []byte("abc"))
	l.Append(Stderr, 3, []byte("defg")) // "de" kept, "fg" dropped
	l.Close()
	f, _ := os.OpenFile(filepath.Join(dir, outFile), os.O_WRONLY|os.O_APPEND, 0)
	f.Write([]byte{Stdout, 0, 0, 0, 0, 0, 0, 0, 9, 'x'}) // a record cut short
	f.Close()
	l, err = Open(dir, 5)
	if err != nil {
		t.Fatal(err)
	}
	if l.Size() != 7 || l.Bytes(Stdout) != 3 || l.Bytes(Stderr) != 4 || l.Bytes(Gap) != 2 {
		t.Fatalf("reopened: size %d stdout %d stderr %d gaps %d", l.Size(), l.Bytes(Stdout), l.Bytes(Stderr), l.Bytes(Gap))
	}
	if err := l.Append(Stdout, 7, []byte("h")); err != nil {
		t.Fatal(err)
	}
	if got, _ := readAll(t, l, 0); got != "abcde???" {
		t.Errorf("read %q", got)
	}
	l.End(1)
	if l, err = Open(dir, 5); err != nil || l.Ended() == nil {
		t.Fatalf("an ended log opened again: %v, end %s", err, l.Ended())
	}
	if err := l.Append(Stdout, 8, []byte("i")); err != ErrEnded {
		t.Errorf("append to an ended log opened again: %v", err)
	}
}
