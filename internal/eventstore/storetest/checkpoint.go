package storetest

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
	"github.com/corral-dev/corral/internal/eventstore"
)

// CheckpointStore is a store that keeps checkpoints.
type CheckpointStore interface {
	eventstore.Store
	eventstore.Checkpoints
}

// RunCheckpoints runs the conformance suite of eventstore.Checkpoints
// against stores made by newStore, which must return an empty store for
// each call and close it in t.Cleanup.
func RunCheckpoints(t *testing.T, newStore func(t *testing.T) CheckpointStore) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s CheckpointStore)
	}{
		{"Missing", testCheckpointMissing},
		{"RoundTrip", testCheckpointRoundTrip},
		{"NeverBackwards", testCheckpointNeverBackwards},
		{"Names", testCheckpointNames},
		{"Invalid", testCheckpointInvalid},
		{"Concurrent", testCheckpointConcurrent},
		{"CallerOwnsData", testCheckpointCallerOwnsData},
		{"LogUntouched", testCheckpointLogUntouched},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.fn(t, newStore(t))
		})
	}
}

// MustSaveCheckpoint saves a checkpoint and fails the test on error.
func MustSaveCheckpoint(tb testing.TB, s eventstore.Checkpoints, name string, pos int64, data []byte) {
	tb.Helper()
	if err := s.SaveCheckpoint(context.Background(), name, pos, data); err != nil {
		tb.Fatalf("SaveCheckpoint(%q, %d, %d bytes): %v", name, pos, len(data), err)
	}
}

// checkCheckpoint fails the test unless checkpoint name is at pos with data.
func checkCheckpoint(tb testing.TB, s eventstore.Checkpoints, name string, pos int64, data []byte) {
	tb.Helper()
	got, gotData, ok, err := s.LoadCheckpoint(context.Background(), name)
	if err != nil || !ok {
		tb.Fatalf("LoadCheckpoint(%q) = ok %v, %v; want the one at %d", name, ok, err, pos)
	}
	if got != pos || !bytes.Equal(gotData, data) {
		tb.Fatalf("LoadCheckpoint(%q) = %d and %d bytes (%.20q), want %d and %d bytes (%.20q)", name, got, len(gotData), gotData, pos, len(data), data)
	}
}

// testCheckpointMissing: a name never saved is not an error.
func testCheckpointMissing(t *testing.T, s CheckpointStore) {
	pos, data, ok, err := s.LoadCheckpoint(context.Background(), "nothing")
	if err != nil || ok || pos != 0 || data != nil {
		t.Fatalf("LoadCheckpoint(never saved) = %d, %d bytes, ok %v, %v; want nothing", pos, len(data), ok, err)
	}
}

// testCheckpointRoundTrip: what is saved is what loads, byte for byte,
// from nothing (nil and empty both load as empty) to a few megabytes, and
// a save replaces the one before.
func testCheckpointRoundTrip(t *testing.T, s CheckpointStore) {
	big := make([]byte, 6<<20)
	crand.Read(big)
	for i, data := range [][]byte{[]byte("state at 7"), {0, 1, 2, 0xff, 0}, big, {}, nil} {
		pos := int64(7 + i)
		MustSaveCheckpoint(t, s, "projection", pos, data)
		checkCheckpoint(t, s, "projection", pos, data)
	}
}

// testCheckpointNeverBackwards: a save at a lower position than the kept
// one changes nothing; one at the same position replaces it.
func testCheckpointNeverBackwards(t *testing.T, s CheckpointStore) {
	MustSaveCheckpoint(t, s, "p", 10, []byte("ten"))
	MustSaveCheckpoint(t, s, "p", 3, []byte("three"))
	checkCheckpoint(t, s, "p", 10, []byte("ten"))
	MustSaveCheckpoint(t, s, "p", 10, []byte("ten again"))
	checkCheckpoint(t, s, "p", 10, []byte("ten again"))
	MustSaveCheckpoint(t, s, "p", 0, []byte("zero"))
	checkCheckpoint(t, s, "p", 10, []byte("ten again"))
	MustSaveCheckpoint(t, s, "p", 11, []byte("eleven"))
	checkCheckpoint(t, s, "p", 11, []byte("eleven"))
}

// testCheckpointNames: each name is a checkpoint of its own.
func testCheckpointNames(t *testing.T, s CheckpointStore) {
	MustSaveCheckpoint(t, s, "a", 5, []byte("a5"))
	MustSaveCheckpoint(t, s, "b", 2, []byte("b2"))
	MustSaveCheckpoint(t, s, "a.archive", 1, []byte("a1"))
	checkCheckpoint(t, s, "a", 5, []byte("a5"))
	checkCheckpoint(t, s, "b", 2, []byte("b2"))
	checkCheckpoint(t, s, "a.archive", 1, []byte("a1"))
}

// testCheckpointInvalid: an empty name or a negative position is refused
// as ErrInvalidArgument and keeps nothing.
func testCheckpointInvalid(t *testing.T, s CheckpointStore) {
	for _, c := range []struct {
		name string
		pos  int64
	}{{"", 1}, {"p", -1}} {
		if err := s.SaveCheckpoint(context.Background(), c.name, c.pos, []byte("x")); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("SaveCheckpoint(%q, %d) = %v, want ErrInvalidArgument", c.name, c.pos, err)
		}
	}
	if _, _, ok, err := s.LoadCheckpoint(context.Background(), "p"); ok || err != nil {
		t.Errorf("after refused saves, LoadCheckpoint = ok %v, %v; want nothing", ok, err)
	}
}

// testCheckpointConcurrent: saves racing in every order, as several
// servers on one database would, leave the one at the highest position.
func testCheckpointConcurrent(t *testing.T, s CheckpointStore) {
	const savers, each = 8, 10
	var wg sync.WaitGroup
	for g := range savers {
		wg.Go(func() {
			for _, i := range rand.Perm(each) {
				pos := int64(i*savers + g) // every position once, in a random order per saver
				if err := s.SaveCheckpoint(context.Background(), "p", pos, fmt.Appendf(nil, "at %d", pos)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	last := int64(savers*each - 1)
	checkCheckpoint(t, s, "p", last, fmt.Appendf(nil, "at %d", last))
}

// testCheckpointCallerOwnsData: the store keeps no reference to the
// slice it was given, nor to the one it returned.
func testCheckpointCallerOwnsData(t *testing.T, s CheckpointStore) {
	data := []byte("original")
	MustSaveCheckpoint(t, s, "p", 1, data)
	copy(data, "CHANGED!")
	_, got, _, err := s.LoadCheckpoint(context.Background(), "p")
	if err != nil {
		t.Fatal(err)
	}
	copy(got, "CHANGED!")
	checkCheckpoint(t, s, "p", 1, []byte("original"))
}

// testCheckpointLogUntouched: a checkpoint is no event, and its position
// is not checked against the log: it changes neither the log nor the
// positions appends get.
func testCheckpointLogUntouched(t *testing.T, s CheckpointStore) {
	MustAppend(t, s, "s", 0, ev("t.a", `{}`))
	MustSaveCheckpoint(t, s, "p", 1, []byte("after one"))
	MustSaveCheckpoint(t, s, "q", 99, []byte("ahead of the log"))
	got := MustAppend(t, s, "s", 1, ev("t.b", `{}`))
	if got[0].Position != 2 {
		t.Errorf("append after checkpoints at position %d, want 2", got[0].Position)
	}
	if all := MustReadAll(t, s, 0); len(all) != 2 {
		t.Errorf("the log holds %d events, want 2", len(all))
	}
}
