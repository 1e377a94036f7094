package errdefs

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Message is the text of err that a person should read: what the HTTP API,
// the MCP tools and the CLI show. Errors are classified by wrapping a class
// ("open x: %w"), so err.Error() ends in the class's name (": invalid
// argument"); Message leaves the classes out, and reduces the errors of
// system calls (*fs.PathError, *os.LinkError, *os.SyscallError) to their
// reason and the paths a caller named, dropping the call's name ("openat",
// "renameat") and absolute paths (the host's, which a client has no use for).
//
// "not found" is kept where nothing else in the message says what is
// missing: "task x: not found" would otherwise read "task x".
func Message(err error) string {
	if err == nil {
		return ""
	}
	msg := message(err)
	if errors.Is(err, ErrNotFound) && !saysMissing(msg) {
		msg = join(msg, ErrNotFound.Error())
	}
	if msg == "" {
		return err.Error() // a bare class: its name is all there is
	}
	return msg
}

// classes are the sentinels whose names Message leaves out.
var classes = []error{
	ErrInvalidArgument, ErrNotFound, ErrAlreadyExists, ErrFailedPrecondition, ErrConflict,
	ErrPermissionDenied, ErrResourceExhausted, ErrUnavailable, ErrNotImplemented, ErrUnauthenticated,
}

func message(err error) string {
	for _, c := range classes {
		if err == c {
			return ""
		}
	}
	switch e := err.(type) {
	case *fs.PathError:
		return withPaths(message(e.Err), e.Path)
	case *os.LinkError:
		return withPaths(message(e.Err), e.Old, e.New)
	case *os.SyscallError:
		return message(e.Err)
	}
	var kids []error
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		kids = u.Unwrap()
	case interface{ Unwrap() error }:
		if k := u.Unwrap(); k != nil {
			kids = []error{k}
		}
	}
	// Each wrapped error's text is replaced by its own message where it
	// appears in err's, last first: by convention it ends the text ("...:
	// %w"), so searching from the end finds it, not an earlier phrase that
	// happens to match. A class's text goes with the ": " before it (after
	// it, at the start).
	if len(kids) == 0 {
		return err.Error()
	}
	rest := err.Error()
	var pieces []string // literal text and the kids' messages, last first
	for i := len(kids) - 1; i >= 0; i-- {
		if kids[i] == nil {
			continue
		}
		kt := kids[i].Error()
		at := strings.LastIndex(rest, kt)
		if at < 0 {
			continue
		}
		pieces = append(pieces, rest[at+len(kt):], message(kids[i]))
		rest = rest[:at]
	}
	out := rest
	drop := false // a class was left out, and nothing said before it
	for i := len(pieces) - 1; i >= 0; i-- {
		p := pieces[i]
		if i%2 == 1 { // a kid's message
			if p == "" {
				out = strings.TrimSuffix(strings.TrimRight(out, " "), ":")
				drop = out == "" || strings.HasSuffix(out, "\n")
			}
			out += p
			continue
		}
		if drop {
			p = strings.TrimLeft(strings.TrimPrefix(p, ":"), " ")
			drop = false
		}
		out += p
	}
	return tidy(out)
}

// join joins two parts of a message with ": ", leaving out an empty one.
func join(a, b string) string {
	a = strings.TrimSuffix(strings.TrimRight(a, " "), ":")
	b = strings.TrimPrefix(strings.TrimLeft(b, " "), ":")
	b = strings.TrimLeft(b, " ")
	switch {
	case a == "":
		return b
	case b == "":
		return a
	case strings.HasPrefix(b, "\n") || strings.HasSuffix(a, "\n"):
		return a + b
	case strings.HasPrefix(b, "("):
		return a + " " + b
	}
	return a + ": " + b
}

// tidy drops the empty lines a class alone on a line (errors.Join) leaves.
func tidy(s string) string {
	lines := strings.Split(s, "\n")
	out := lines[:0]
	for _, l := range lines {
		l = strings.TrimSuffix(strings.TrimRight(l, " "), ":")
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// withPaths puts the relative paths of a system call before its reason:
// those a caller named (os.Root reports them as given). An absolute path
// is the host's and is left out.
func withPaths(reason string, paths ...string) string {
	var named []string
	for _, p := range paths {
		if p != "" && !filepath.IsAbs(p) {
			named = append(named, p)
		}
	}
	if len(named) != len(paths) {
		return reason
	}
	return join(strings.Join(named, " -> "), reason)
}

// saysMissing reports whether a message already says that something does
// not exist, so that "not found" after it would only repeat it.
func saysMissing(msg string) bool {
	m := strings.ToLower(msg)
	for _, s := range []string{"not found", "no such", "does not exist", "not exist"} {
		if strings.Contains(m, s) {
			return true
		}
	}
	for _, part := range strings.Split(m, ": ") {
		if strings.HasPrefix(part, "no ") {
			return true
		}
	}
	return false
}
