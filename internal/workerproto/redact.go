package workerproto

import (
	"sort"
	"strings"
)

// Redacted replaces a secret in a transcript, a summary or an error.
const Redacted = "[REDACTED]"

// secretWords mark an environment variable whose value is a secret.
var secretWords = []string{"KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH"}

// minSecret is the shortest value taken as a secret: shorter values
// ("1", "true") would redact ordinary text.
const minSecret = 8

// Secrets returns the values of the variables in environ whose names say
// they are secrets (ANTHROPIC_API_KEY, GITHUB_TOKEN, ...), longest first.
func Secrets(environ []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || len(v) < minSecret || seen[v] {
			continue
		}
		name := strings.ToUpper(k)
		for _, w := range secretWords {
			if strings.Contains(name, w) {
				seen[v] = true
				out = append(out, v)
				break
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

// RedactString replaces every secret in s.
func RedactString(s string, secrets []string) string {
	for _, sec := range secrets {
		s = strings.ReplaceAll(s, sec, Redacted)
	}
	return s
}
