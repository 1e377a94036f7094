package egress

import (
	"errors"
	"net/netip"
	"slices"
	"testing"

	"github.com/corral-dev/corral/internal/errdefs"
)

func TestParseRule(t *testing.T) {
	tests := []struct {
		in   string
		want string // Rule.String(); "" means an error
	}{
		{"api.anthropic.com", "api.anthropic.com"},
		{"API.Anthropic.COM.", "api.anthropic.com"},
		{"api.example.com:8443", "api.example.com:8443"},
		{"*.googleapis.com", "*.googleapis.com"},
		{"*.example.com:443", "*.example.com:443"},
		{"127.0.0.1:8080", "127.0.0.1:8080"},
		{"localhost:9000", "localhost:9000"},
		{"[::1]:8080", "[::1]:8080"},
		{"::1", "::1"},
		{"::ffff:10.0.0.1", "10.0.0.1"},
		{"10.1.2.3", "10.1.2.3"},
		{"my_host.internal", "my_host.internal"},
		{"", ""},
		{"*", ""},
		{"*.", ""},
		{"https://api.example.com", ""},
		{"api.example.com/v1", ""},
		{"api.example.com:0", ""},
		{"api.example.com:70000", ""},
		{"api.example.com:http", ""},
		{"*.10.0.0.1", ""},
		{"fe80::1%eth0", ""},
		{"bad host", ""},
		{"-bad.example.com", ""},
		{"a..b", ""},
		{"[::1", ""},
	}
	for _, tt := range tests {
		r, err := ParseRule(tt.in)
		switch {
		case tt.want == "" && err == nil:
			t.Errorf("ParseRule(%q) = %v, want an error", tt.in, r)
		case tt.want == "" && !errors.Is(err, errdefs.ErrInvalidArgument):
			t.Errorf("ParseRule(%q) error %v, want ErrInvalidArgument", tt.in, err)
		case tt.want != "" && err != nil:
			t.Errorf("ParseRule(%q): %v", tt.in, err)
		case tt.want != "" && r.String() != tt.want:
			t.Errorf("ParseRule(%q) = %q, want %q", tt.in, r.String(), tt.want)
		}
	}
}

func TestParseRulesReportsEveryProblem(t *testing.T) {
	_, err := ParseRules([]string{"ok.example", "http://x", "also.ok", "*"})
	var n int
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		if errors.Is(e, errdefs.ErrInvalidArgument) {
			n++
		}
	}
	if n != 2 {
		t.Errorf("got %d problems (%v), want 2", n, err)
	}
}

func TestPolicyDecide(t *testing.T) {
	allow := MustParseRules("api.anthropic.com", "*.googleapis.com", "api.example.com:8443", "127.0.0.1:9000", "localhost:9001", "[::1]:9002", "private.example")
	tests := []struct {
		open         bool
		host         string
		port         int
		allowed, lit bool
		whatItChecks string
	}{
		{false, "api.anthropic.com", 443, true, false, "exact name, https"},
		{false, "API.ANTHROPIC.COM.", 443, true, false, "case and trailing dot"},
		{false, "api.anthropic.com", 80, true, false, "exact name, http"},
		{false, "api.anthropic.com", 22, false, false, "a name without a port is web ports only"},
		{false, "evil-api.anthropic.com", 443, false, false, "no implicit subdomains"},
		{false, "anthropic.com", 443, false, false, "no parent"},
		{false, "api.anthropic.com.evil.net", 443, false, false, "no prefix match"},
		{false, "generativelanguage.googleapis.com", 443, true, false, "wildcard subdomain"},
		{false, "a.b.googleapis.com", 443, true, false, "wildcard deeper subdomain"},
		{false, "googleapis.com", 443, false, false, "wildcard excludes the bare suffix"},
		{false, "xgoogleapis.com", 443, false, false, "wildcard needs the dot"},
		{false, "api.example.com", 8443, true, false, "host:port"},
		{false, "api.example.com", 443, false, false, "host:port is that port only"},
		{false, "127.0.0.1", 9000, true, true, "IP literal is literal"},
		{false, "127.0.0.1", 9001, false, false, "IP literal, other port"},
		{false, "localhost", 9001, true, true, "localhost is literal"},
		{false, "::1", 9002, true, true, "IPv6 literal"},
		{false, "::ffff:127.0.0.1", 9000, true, true, "IPv4-mapped form of a literal"},
		{false, "private.example", 443, true, false, "a name is never literal"},
		{false, "example.org", 443, false, false, "unlisted"},
		{true, "example.org", 443, true, false, "open allows unlisted names"},
		{true, "example.org", 25, true, false, "open allows any port"},
		{true, "127.0.0.1", 9000, true, true, "open keeps literals"},
		{true, "10.0.0.1", 443, true, false, "open: allowed by name, the address check refuses it"},
	}
	for _, tt := range tests {
		p := Policy{Open: tt.open, Allow: allow}
		h, ok := canonicalHost(tt.host)
		if !ok {
			t.Fatalf("canonicalHost(%q) failed", tt.host)
		}
		d := p.decide(h, tt.port)
		if d.allowed != tt.allowed || d.literal != tt.lit {
			t.Errorf("%s: decide(%q, %d) open=%v = %+v, want allowed=%v literal=%v", tt.whatItChecks, tt.host, tt.port, tt.open, d, tt.allowed, tt.lit)
		}
	}
}

func TestSpecial(t *testing.T) {
	special := []string{
		"127.0.0.1", "127.5.6.7", "::1", "10.0.0.1", "172.16.0.1", "172.31.255.255", "192.168.1.1",
		"fc00::1", "fd12::1", "169.254.169.254", "fe80::1", "224.0.0.1", "ff02::1", "0.0.0.0", "::",
		"100.64.0.1", "100.127.255.255", "192.0.0.8", "192.0.2.1", "198.18.0.1", "198.51.100.1", "203.0.113.1",
		"240.0.0.1", "255.255.255.255", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "64:ff9b::a00:1", "2002:7f00:1::",
		"2001:db8::1", "fec0::1", "0.1.2.3", "::127.0.0.1",
	}
	public := []string{"1.1.1.1", "8.8.8.8", "93.184.216.34", "172.32.0.1", "100.128.0.1", "2606:4700::1111", "64:ff9b::808:808", "2002:808:808::"}
	for _, s := range special {
		if !Special(netip.MustParseAddr(s)) {
			t.Errorf("Special(%s) = false, want true", s)
		}
	}
	for _, s := range public {
		if Special(netip.MustParseAddr(s)) {
			t.Errorf("Special(%s) = true, want false", s)
		}
	}
}

// Only loopback literals with a port are forwarded, each once.
func TestLoopbackForwards(t *testing.T) {
	rules, err := ParseRules([]string{"api.anthropic.com", "127.0.0.1:8080", "127.0.0.1", "[::1]:11434", "localhost:9000", "10.0.0.5:80", "127.0.0.1:8080", "127.0.0.2:7000"})
	if err != nil {
		t.Fatal(err)
	}
	got := LoopbackForwards(rules)
	want := []string{"127.0.0.1:8080", "[::1]:11434", "127.0.0.2:7000"}
	if !slices.Equal(got, want) {
		t.Errorf("LoopbackForwards = %v, want %v", got, want)
	}
}

func TestCovers(t *testing.T) {
	server := Policy{Allow: MustParseRules("api.example.com", "*.github.com", "pypi.org:443", "127.0.0.1:8080")}
	for entry, want := range map[string]bool{
		"api.example.com":      true,
		"api.example.com:443":  true,
		"api.example.com:8443": false,
		"other.example.com":    false,
		"raw.github.com":       true,
		"*.github.com":         true,
		"*.api.github.com":     true,
		"github.com":           false,
		"pypi.org":             false, // 80 too
		"pypi.org:443":         true,
		"127.0.0.1:8080":       true,
		"127.0.0.1:9090":       false,
		"*.example.com":        false,
		"10.0.0.1":             false,
		"localhost:8080":       false,
	} {
		if got := server.Covers(MustParseRules(entry)[0]); got != want {
			t.Errorf("Covers(%q) = %v, want %v", entry, got, want)
		}
	}
	if !(Policy{Open: true}).Covers(MustParseRules("*.anything.org")[0]) {
		t.Error("an open policy does not cover a wildcard")
	}
}
