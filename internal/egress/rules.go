// Package egress is the proxy through which sandboxed workers reach the
// network (SPEC §4). A worker's sandbox has loopback only; its relay hands
// every TCP connection to a unix socket that this package listens on, one
// socket per task, so the proxy always knows which task speaks.
//
// The proxy speaks HTTP CONNECT (for https and anything else over TLS) and
// plain HTTP forwarding of absolute-URI requests. A Policy decides which
// hosts a task may reach: only the listed ones (allowlist) or every host
// (open). In both, the proxy resolves names itself and dials the address it
// checked, so a DNS answer cannot change between the check and the dial
// (no rebinding); and it refuses loopback, private, link-local, multicast
// and other special-purpose addresses unless the allow entry names that
// address itself (an IP literal, or localhost). Every attempt, allowed or
// denied, ends in one Record passed to Options.OnConnection.
//
// Rules (Rule, ParseRule): "host" allows the host on the web's ports, 443
// and 80 (a request without a port means 443 for CONNECT and 80 for plain
// HTTP); "host:port" only on that port; "*.example.com" every subdomain of
// example.com (not example.com itself), with or without ":port". Matching
// ignores case and a trailing dot.
package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Mode is a task's network policy.
type Mode string

// Modes. ModeNone has no proxy at all.
const (
	ModeNone      Mode = "none"
	ModeAllowlist Mode = "allowlist"
	ModeOpen      Mode = "open"
)

// Rule is one allow entry.
type Rule struct {
	// Host is the lowercase host name or IP literal, without a trailing dot;
	// for a wildcard, the suffix after "*.".
	Host string
	// Wildcard: Host is a suffix and only its subdomains match.
	Wildcard bool
	// Port is the only port allowed; 0 allows 443 and 80.
	Port int
	// Addr is set when Host is an IP literal.
	Addr netip.Addr
}

// String returns the rule in the form ParseRule reads.
func (r Rule) String() string {
	h := r.Host
	if r.Wildcard {
		h = "*." + h
	}
	if r.Port == 0 {
		return h
	}
	return net.JoinHostPort(h, strconv.Itoa(r.Port))
}

// literal reports whether the rule names an address itself (an IP literal
// or localhost), the only rules that let a connection reach a special
// address.
func (r Rule) literal() bool { return !r.Wildcard && (r.Addr.IsValid() || r.Host == "localhost") }

// matches reports whether the rule allows host (normalized) on port.
func (r Rule) matches(host string, port int) bool {
	switch {
	case r.Port == 0 && port != 443 && port != 80:
		return false
	case r.Port != 0 && r.Port != port:
		return false
	}
	if r.Wildcard {
		return strings.HasSuffix(host, "."+r.Host)
	}
	return host == r.Host
}

// ParseRule parses one allow entry: "host", "host:port", "*.suffix",
// "*.suffix:port", an IP literal with or without a port ("127.0.0.1:8080",
// "[::1]:8080", "::1"). It returns an error wrapping
// errdefs.ErrInvalidArgument for anything else (a scheme, a path, a bare
// "*", an empty string).
func ParseRule(s string) (Rule, error) {
	bad := func(why string) (Rule, error) {
		return Rule{}, fmt.Errorf("parse allow entry %q: %s: %w", s, why, errdefs.ErrInvalidArgument)
	}
	host, port := strings.TrimSpace(s), 0
	if host == "" {
		return bad("empty")
	}
	if strings.Contains(host, "/") {
		return bad("no scheme or path, only host or host:port")
	}
	// A port is present if the entry splits as host:port; a bare IPv6
	// address (several colons, no brackets) has none.
	if h, p, err := net.SplitHostPort(host); err == nil {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return bad("port must be 1 to 65535")
		}
		host, port = h, n
	} else if strings.HasPrefix(host, "[") || strings.Count(host, ":") == 1 {
		return bad(err.Error())
	}
	r := Rule{Port: port}
	if rest, ok := strings.CutPrefix(host, "*."); ok {
		r.Wildcard = true
		host = rest
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if r.Wildcard || a.Zone() != "" {
			return bad("an IP address takes no wildcard or zone")
		}
		r.Host, r.Addr = a.Unmap().String(), a.Unmap()
		return r, nil
	}
	h, ok := normalizeHost(host)
	if !ok {
		return bad("not a host name")
	}
	r.Host = h
	return r, nil
}

// ParseRules parses every entry and returns every problem at once.
func ParseRules(entries []string) ([]Rule, error) {
	var rules []Rule
	var errs []error
	for _, e := range entries {
		r, err := ParseRule(e)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		rules = append(rules, r)
	}
	return rules, errors.Join(errs...)
}

// MustParseRules is ParseRules for fixed lists; it panics on an error.
func MustParseRules(entries ...string) []Rule {
	rules, err := ParseRules(entries)
	if err != nil {
		panic(err)
	}
	return rules
}

// normalizeHost lowercases a host name and drops one trailing dot. It
// reports false for anything that is not a DNS name of letters, digits,
// hyphens and underscores in labels of 1 to 63 bytes.
func normalizeHost(h string) (string, bool) {
	h = strings.ToLower(strings.TrimSuffix(h, "."))
	if h == "" || len(h) > 253 {
		return "", false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return "", false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", false
			}
		}
	}
	return h, true
}

// Policy is what one task may reach.
type Policy struct {
	// Open allows every host; Allow still decides which special addresses
	// (loopback, private, ...) may be reached.
	Open bool
	// Allow are the allow entries.
	Allow []Rule
	// Models are the model APIs of the task's agent, which the proxy
	// relays adding their keys (ModelHost).
	Models []Model
	// Credentials are the credential rules the proxy applies to the
	// task's HTTPS requests, intercepting the hosts they name (with
	// Options.CA). A rule does not allow its host: Open or Allow must.
	Credentials []Credential
}

// decision is a policy's answer for one host and port.
type decision struct {
	allowed bool
	// literal: an entry names this address itself, so special addresses
	// are allowed.
	literal bool
}

// decide answers for host (normalized, or an IP literal's canonical form)
// on port.
func (p Policy) decide(host string, port int) decision {
	var d decision
	for _, r := range p.Allow {
		if r.matches(host, port) {
			d.allowed = true
			if r.literal() {
				d.literal = true
			}
		}
	}
	if p.Open {
		d.allowed = true
	}
	return d
}

// Covers reports whether everything r lets through the policy lets
// through as well: a task's own entry within the server's allowlist.
func (p Policy) Covers(r Rule) bool {
	ports := []int{r.Port}
	if r.Port == 0 {
		ports = []int{443, 80}
	}
	for _, port := range ports {
		if !r.Wildcard {
			d := p.decide(r.Host, port)
			if !d.allowed || r.literal() && !d.literal {
				return false
			}
			continue
		}
		// Every subdomain of r.Host: only a wildcard of the policy whose
		// suffix is r.Host or a parent of it covers them all.
		covered := p.Open
		for _, a := range p.Allow {
			if a.Wildcard && (a.Host == r.Host || strings.HasSuffix(r.Host, "."+a.Host)) && a.matches("x."+r.Host, port) {
				covered = true
			}
		}
		if !covered {
			return false
		}
	}
	return true
}

// Allows reports whether the policy lets a connection to host:port through
// its name check (the address check comes after resolving).
func (p Policy) Allows(host string, port int) bool {
	h, ok := canonicalHost(host)
	return ok && p.decide(h, port).allowed
}

// canonicalHost is a request's host in the form rules hold: an IP
// literal's canonical form, or a normalized host name.
func canonicalHost(host string) (string, bool) {
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return "", false
		}
		return a.Unmap().String(), true
	}
	return normalizeHost(host)
}

// LoopbackForwards returns the loopback addresses with a port that rules
// name literally (127.0.0.1:8080, [::1]:11434), as host:port: a sandbox
// has a loopback of its own, so its worker forwards each of these through
// the proxy to the server's host, where the operator's model server or
// gateway listens.
func LoopbackForwards(rules []Rule) []string {
	var out []string
	for _, r := range rules {
		if r.Addr.IsValid() && r.Addr.IsLoopback() && r.Port != 0 && !r.Wildcard {
			a := netip.AddrPortFrom(r.Addr, uint16(r.Port)).String()
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out
}
