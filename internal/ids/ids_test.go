package ids

import (
	"strings"
	"testing"
	"time"
)

func TestSortable(t *testing.T) {
	prev := New()
	for i := 0; i < 1000; i++ {
		id := New()
		if id <= prev {
			t.Fatalf("id %d: %q is not after %q", i, id, prev)
		}
		if !Valid(id) {
			t.Fatalf("Valid(%q) = false", id)
		}
		prev = id
	}
}

func TestSortableAcrossMilliseconds(t *testing.T) {
	t0 := time.Now().Add(time.Hour) // later than anything made so far
	a := NewAt(t0)
	b := NewAt(t0.Add(time.Millisecond))
	c := NewAt(t0) // the clock went back: still after b
	if !(a < b && b < c) {
		t.Errorf("want %q < %q < %q", a, b, c)
	}
	// The first 10 characters are the 48-bit millisecond timestamp.
	if a[:10] == b[:10] {
		t.Errorf("timestamps of %q and %q are equal", a, b)
	}
	if b[:10] != c[:10] {
		t.Errorf("an id made for an earlier time (%q) has a new timestamp, not b's (%q)", c, b)
	}
}

func TestValid(t *testing.T) {
	good := New()
	tests := []struct {
		s    string
		want bool
	}{
		{good, true},
		{strings.Repeat("0", 26), true},
		{"7" + strings.Repeat("z", 25), true},
		{"8" + strings.Repeat("0", 25), false}, // over 128 bits
		{good[:25], false},
		{good + "0", false},
		{"", false},
		{strings.ToUpper(good[:1]) + strings.Repeat("A", 25), false},
		{"0" + strings.Repeat("i", 25), false},
		{"0" + strings.Repeat("l", 25), false},
		{"0" + strings.Repeat("o", 25), false},
		{"0" + strings.Repeat("u", 25), false},
		{"0" + strings.Repeat("-", 25), false},
	}
	for _, tt := range tests {
		if got := Valid(tt.s); got != tt.want {
			t.Errorf("Valid(%q) = %v, want %v", tt.s, got, tt.want)
		}
	}
}

func TestConcurrentUnique(t *testing.T) {
	const n, per = 8, 500
	out := make(chan string, n*per)
	done := make(chan struct{})
	for i := 0; i < n; i++ {
		go func() {
			for j := 0; j < per; j++ {
				out <- New()
			}
			done <- struct{}{}
		}()
	}
	for i := 0; i < n; i++ {
		<-done
	}
	close(out)
	seen := map[string]bool{}
	for id := range out {
		if seen[id] {
			t.Fatalf("duplicate id %q", id)
		}
		seen[id] = true
	}
}
