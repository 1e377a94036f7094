// Package ids makes sortable unique identifiers: a millisecond timestamp and
// random bits in lowercase Crockford base32, monotonic within one process, so
// ids sort in the order they were made.
package ids

import (
	"crypto/rand"
	"encoding/binary"
	"sync"
	"time"
)

const alphabet = "0123456789abcdefghjkmnpqrstvwxyz"

var (
	mu       sync.Mutex
	lastMs   uint64
	lastRand [10]byte
)

// New returns a 26-character sortable id.
func New() string { return NewAt(time.Now()) }

// NewAt returns a sortable id for time t. Ids made in the same millisecond
// increase by one in their random part, so they still sort in order.
func NewAt(t time.Time) string {
	ms := uint64(t.UnixMilli())
	mu.Lock()
	var r [10]byte
	if ms <= lastMs {
		ms = lastMs
		r = lastRand
		for i := len(r) - 1; i >= 0; i-- {
			r[i]++
			if r[i] != 0 {
				break
			}
		}
	} else {
		if _, err := rand.Read(r[:]); err != nil {
			panic(err) // crypto/rand never fails on Linux
		}
		r[0] &= 0x7f // leave room to increment within a millisecond
	}
	lastMs, lastRand = ms, r
	mu.Unlock()

	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], ms<<16)
	copy(b[6:], r[:])
	return encode(b)
}

// encode writes 128 bits as 26 base32 characters, most significant first.
func encode(b [16]byte) string {
	hi := binary.BigEndian.Uint64(b[:8])
	lo := binary.BigEndian.Uint64(b[8:])
	var out [26]byte
	for i := 25; i >= 0; i-- {
		out[i] = alphabet[lo&31]
		lo = lo>>5 | hi<<59
		hi >>= 5
	}
	return string(out[:])
}

// Valid reports whether s looks like an id New made.
func Valid(s string) bool {
	if len(s) != 26 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z') || c == 'i' || c == 'l' || c == 'o' || c == 'u' {
			return false
		}
	}
	return s[0] <= '7'
}
