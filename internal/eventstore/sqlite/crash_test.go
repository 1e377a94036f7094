package sqlite

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/eventstore"
	"github.com/corral-dev/corral/internal/eventstore/storetest"
)

// crashChildEnv, when set to a database path, makes the test binary run
// crashChild instead of the tests (see TestMain).
const crashChildEnv = "CORRAL_SQLITE_CRASH_CHILD"

const (
	crashStreams   = 4
	crashReadyLine = "ready"
)

// crashChild appends to a few streams until it is killed, printing every
// acknowledged event as one JSON line on stdout after Append returned nil.
// It exits by itself after 30 s in case its parent is gone.
func crashChild() int {
	path := os.Getenv(crashChildEnv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Open(ctx, path, discardLogger())
	if err != nil {
		fmt.Fprintln(os.Stderr, "open:", err)
		return 2
	}
	var out sync.Mutex
	emit := func(b []byte) error {
		out.Lock()
		defer out.Unlock()
		// os.Stdout is unbuffered: one write(2) per line, a pipe write of
		// less than PIPE_BUF bytes, so a kill never leaves half a line
		// that parses.
		_, err := os.Stdout.Write(b)
		return err
	}
	if err := emit([]byte(crashReadyLine + "\n")); err != nil {
		return 2
	}
	errc := make(chan error, crashStreams)
	for i := range crashStreams {
		stream := fmt.Sprintf("crash-%d", i)
		go func() {
			existing, err := s.ReadStream(ctx, stream, 0)
			if err != nil {
				errc <- err
				return
			}
			version := int64(len(existing))
			for n := 0; ; n++ {
				evs := []eventstore.Proposed{{
					Type: "crash.tick", SchemaVersion: 1, Actor: "child", CorrelationID: stream,
					Data: fmt.Appendf(nil, `{"v":%d,"r":%d}`, version+1, rand.Int64()),
				}}
				if n%3 == 0 { // some multi-event appends, to check they land whole
					evs = append(evs, eventstore.Proposed{
						Type: "crash.tock", SchemaVersion: 2,
						Data: fmt.Appendf(nil, `{"v":%d}`, version+2),
					})
				}
				got, err := s.Append(ctx, stream, version, evs...)
				if err != nil {
					errc <- fmt.Errorf("append to %s at %d: %w", stream, version, err)
					return
				}
				var line []byte
				for _, e := range got {
					b, err := json.Marshal(e)
					if err != nil {
						errc <- err
						return
					}
					line = append(append(line, b...), '\n')
				}
				if err := emit(line); err != nil {
					errc <- err
					return
				}
				version = got[len(got)-1].StreamVersion
			}
		}()
	}
	err = <-errc
	fmt.Fprintln(os.Stderr, "child:", err)
	return 2
}

// TestCrashKeepsAcknowledgedAppends kills a writing child process with
// SIGKILL at random moments, 20 times on one database, and checks after
// each kill that every append the child saw acknowledged is stored intact
// and that streams and positions have no gaps. (SIGKILL loses the process,
// not the page cache; power loss is covered by synchronous=FULL, which this
// test cannot cut.)
func TestCrashKeepsAcknowledgedAppends(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatalf("find test binary: %v", err)
	}
	path := filepath.Join(t.TempDir(), "corral.db")
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	acked := map[string]eventstore.Event{} // by event id, over all rounds
	const rounds = 20
	for round := range rounds {
		// Every fifth round kills without waiting for "ready", so the kill
		// may land in Open (lock, migrations, WAL recovery).
		early := round%5 == 0
		delay := 20*time.Millisecond + time.Duration(rng.Int64N(int64(250*time.Millisecond)))
		lines := runAndKill(t, exe, path, early, delay)
		for _, l := range lines {
			if l == crashReadyLine {
				continue
			}
			var e eventstore.Event
			if err := json.Unmarshal([]byte(l), &e); err != nil {
				t.Fatalf("round %d: child printed %q: %v", round, l, err)
			}
			acked[e.ID] = e
		}
		t.Logf("round %d: killed after %v (early %v), %d events acknowledged so far", round, delay, early, len(acked))
		verifyCrashStore(t, path, acked, round)
		if t.Failed() {
			return
		}
	}
	if len(acked) == 0 {
		t.Fatalf("the child acknowledged no appends in %d rounds", rounds)
	}
}

// runAndKill starts the child on path, kills it with SIGKILL after delay
// (counted from its "ready" line unless early) and returns the complete
// lines it printed.
func runAndKill(t *testing.T, exe, path string, early bool, delay time.Duration) []string {
	t.Helper()
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), crashChildEnv+"="+path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatalf("stdout pipe: %v", err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child: %v", err)
	}
	ready := make(chan struct{})
	linesc := make(chan []string, 1)
	go func() {
		var lines []string
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() { // Scan drops a final line without '\n': a half-written one
			if sc.Text() == crashReadyLine {
				close(ready)
			}
			lines = append(lines, sc.Text())
		}
		linesc <- lines
	}()
	if !early {
		select {
		case <-ready:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("child not ready after 10s; stderr:\n%s", stderr.String())
		}
	}
	time.Sleep(delay)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill child: %v", err)
	}
	lines := <-linesc
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v before it was killed; stderr:\n%s", err, stderr.String())
	}
	return lines
}

func verifyCrashStore(t *testing.T, path string, acked map[string]eventstore.Event, round int) {
	t.Helper()
	s, err := Open(context.Background(), path, discardLogger())
	if err != nil {
		t.Fatalf("round %d: reopen after kill: %v", round, err)
	}
	defer func() {
		if err := s.Close(); err != nil {
			t.Errorf("round %d: close: %v", round, err)
		}
	}()
	all := storetest.MustReadAll(t, s, 0)
	byID := make(map[string]eventstore.Event, len(all))
	versions := map[string]int64{}
	for i, e := range all {
		if e.Position != int64(i+1) {
			t.Fatalf("round %d: event %d of ReadAll has position %d, want %d (gap or disorder)", round, i, e.Position, i+1)
		}
		if e.StreamVersion != versions[e.StreamID]+1 {
			t.Fatalf("round %d: stream %s version %d follows %d", round, e.StreamID, e.StreamVersion, versions[e.StreamID])
		}
		versions[e.StreamID] = e.StreamVersion
		byID[e.ID] = e
	}
	missing := 0
	for id, want := range acked {
		got, ok := byID[id]
		if !ok {
			missing++
			if missing <= 5 {
				t.Errorf("round %d: acknowledged event %s (%s v%d) is lost", round, id, want.StreamID, want.StreamVersion)
			}
			continue
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("round %d: event %s differs from its acknowledgement (-acked +stored):\n%s", round, id, diff)
		}
	}
	if missing > 0 {
		t.Errorf("round %d: %d of %d acknowledged events lost", round, missing, len(acked))
	}
}
