package sandbox_test

import (
	"strings"
	"testing"

	"github.com/corral-dev/corral/internal/sandbox"
)

// TestLastWords finds why a sandbox's main process ended in what it wrote
// last.
func TestLastWords(t *testing.T) {
	crash := "time=x level=INFO msg=\"agent started\"\n" +
		"runtime: failed to create new OS thread (have 7 already; errno=11)\n" +
		"runtime: may need to increase max user processes (ulimit -u)\n" +
		"fatal error: newosproc\n\ngoroutine 1 [running]:\nruntime.throw(...)\n\t/usr/local/go/src/runtime/panic.go:1 +0x1\n"
	for _, tc := range []struct{ name, log, want string }{
		{"go crash", crash, "runtime: failed to create new OS thread (have 7 already; errno=11); runtime: may need to increase max user processes (ulimit -u); fatal error: newosproc"},
		{"panic", "starting\npanic: boom\n\ngoroutine 1 [running]:\nmain.main()\n", "panic: boom"},
		{"last line", "bwrap: Can't mount proc on /newroot/proc: Operation not permitted\n\n", "bwrap: Can't mount proc on /newroot/proc: Operation not permitted"},
		{"controls and bad UTF-8", "\x1b]52;c;AAAA\x07 evil\xff\n", "]52;c;AAAA evil\uFFFD"},
		{"long", strings.Repeat("x", 1000), strings.Repeat("x", 300) + "…"},
		{"empty", "", ""},
		{"only the window", "panic: early\n" + strings.Repeat("more\n", sandbox.LastWordsWindow/5), "more"},
	} {
		if got := sandbox.LastWords([]byte(tc.log)); got != tc.want {
			t.Errorf("%s: LastWords = %q, want %q", tc.name, got, tc.want)
		}
	}
}
