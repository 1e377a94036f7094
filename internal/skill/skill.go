// Package skill reads, checks and writes skill definitions: a directory
// shared/skills/<name>/ holding SKILL.md, a Markdown file whose YAML
// frontmatter names the skill and says in one line what it is for (SPEC §5),
// and any scripts the skill uses. Workers read skills from
// /workspace/shared/skills/; the prompt preamble lists them.
//
// The frontmatter keys Corral reads are name, description, docker_image and
// dependencies. Other keys (license, allowed-tools, metadata, ... of other
// SKILL.md conventions) are kept in the file and ignored, so a skill written
// for another agent loads unchanged. The package does no I/O.
package skill

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/corral-dev/corral/internal/clip"
	"regexp"
	"strings"
	"sync"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/corral-dev/corral/internal/errdefs"
)

// Limits of a skill definition.
const (
	MaxNameLen        = 64
	MaxDescriptionLen = 1024 // characters, not bytes
	MaxImageLen       = 255
	MaxDependencies   = 64
	MaxDependencyLen  = 255
	// MaxFileBytes bounds SKILL.md itself; scripts beside it are bounded by
	// the caller.
	MaxFileBytes = 256 << 10
)

// FileName is the definition's file name inside a skill's directory.
const FileName = "SKILL.md"

// nameRE is compiled on first use: the corral binary is also every
// sandbox's worker, which never needs it.
var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`) })

// Skill is a parsed SKILL.md.
type Skill struct {
	Name         string   `json:"name" yaml:"name"`
	Description  string   `json:"description" yaml:"description"`
	DockerImage  string   `json:"docker_image,omitempty" yaml:"docker_image,omitempty"`
	Dependencies []string `json:"dependencies,omitempty" yaml:"dependencies,omitempty"`
	// Body is the Markdown after the frontmatter: the instructions.
	Body string `json:"-" yaml:"-"`
}

// CheckName reports whether name is a valid skill name: lowercase ASCII
// letters, digits and hyphens, starting with a letter or digit (so it is
// never taken for a command-line flag), at most 64 characters. The error is
// a FieldError of field "name".
func CheckName(name string) error {
	switch {
	case name == "":
		return errdefs.Field("name", "is required")
	case len(name) > MaxNameLen:
		return errdefs.Field("name", fmt.Sprintf("is %d characters, over the limit of %d", len(name), MaxNameLen))
	case !nameRE().MatchString(name):
		return errdefs.Field("name", fmt.Sprintf("%q must be lowercase letters, digits and hyphens, starting with a letter or digit", clip.String(name, 80)))
	}
	return nil
}

// Validate returns every problem of s at once (errors.Join of FieldErrors).
func (s Skill) Validate() error {
	var errs []error
	if err := CheckName(s.Name); err != nil {
		errs = append(errs, err)
	}
	d := strings.TrimSpace(s.Description)
	switch n := utf8.RuneCountInString(s.Description); {
	case d == "":
		errs = append(errs, errdefs.Field("description", "is required: one line saying what the skill does and when to use it"))
	case !utf8.ValidString(s.Description) || strings.ContainsRune(s.Description, 0):
		errs = append(errs, errdefs.Field("description", "must be UTF-8 text without NUL bytes"))
	case n > MaxDescriptionLen:
		errs = append(errs, errdefs.Field("description", fmt.Sprintf("is %d characters, over the limit of %d", n, MaxDescriptionLen)))
	}
	if img := s.DockerImage; img != "" && (len(img) > MaxImageLen || strings.ContainsAny(img, " \t\r\n\x00")) {
		errs = append(errs, errdefs.Field("docker_image", fmt.Sprintf("must be an image reference without spaces, at most %d bytes", MaxImageLen)))
	}
	if len(s.Dependencies) > MaxDependencies {
		errs = append(errs, errdefs.Field("dependencies", fmt.Sprintf("has %d entries, over the limit of %d", len(s.Dependencies), MaxDependencies)))
	}
	for i, dep := range s.Dependencies {
		if strings.TrimSpace(dep) == "" || len(dep) > MaxDependencyLen || strings.ContainsAny(dep, "\r\n\x00") || !utf8.ValidString(dep) {
			errs = append(errs, errdefs.Field(fmt.Sprintf("dependencies[%d]", i), fmt.Sprintf("must be a non-empty line of at most %d bytes", MaxDependencyLen)))
		}
	}
	return errors.Join(errs...)
}

// Summary is the description's first line, cut to n bytes, for listings and
// the prompt preamble.
func (s Skill) Summary(n int) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s.Description), "\n")
	line = strings.TrimSpace(line)
	if len(line) <= n {
		return line
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(line[cut]) {
		cut--
	}
	return line[:cut] + "…"
}

// frontmatter is what Parse decodes: the known keys, with types loose
// enough to report a wrong type as a field error rather than a YAML one.
type frontmatter struct {
	Name         any `yaml:"name"`
	Description  any `yaml:"description"`
	DockerImage  any `yaml:"docker_image"`
	Dependencies any `yaml:"dependencies"`
}

// Parse reads a SKILL.md: "---", a YAML mapping, "---", then the body. It
// returns every problem at once (FieldErrors; field "frontmatter" for the
// file's shape), so a caller can show them all.
func Parse(content []byte) (Skill, error) {
	if len(content) > MaxFileBytes {
		return Skill{}, &errdefs.FieldError{Field: "content", Err: fmt.Errorf("SKILL.md is %d bytes, over the limit of %d: %w", len(content), MaxFileBytes, errdefs.ErrTooLarge)}
	}
	if !utf8.Valid(content) || bytes.IndexByte(content, 0) >= 0 {
		return Skill{}, errdefs.Field("content", "SKILL.md must be UTF-8 text without NUL bytes")
	}
	head, body, err := split(string(content))
	if err != nil {
		return Skill{}, err
	}
	var node yaml.Node
	if err := yaml.Unmarshal([]byte(head), &node); err != nil {
		return Skill{}, errdefs.Field("frontmatter", "is not valid YAML: "+yamlMessage(err))
	}
	if len(node.Content) == 0 || node.Content[0].Kind != yaml.MappingNode {
		return Skill{}, errdefs.Field("frontmatter", "must be a YAML mapping with at least name and description")
	}
	var fm frontmatter
	if err := node.Decode(&fm); err != nil {
		return Skill{}, errdefs.Field("frontmatter", "cannot be read: "+yamlMessage(err))
	}
	var errs []error
	str := func(field string, v any) string {
		switch x := v.(type) {
		case nil:
			return ""
		case string:
			return x
		default:
			errs = append(errs, errdefs.Field(field, fmt.Sprintf("must be a string, not %T", v)))
			return ""
		}
	}
	s := Skill{
		Name:        str("name", fm.Name),
		Description: str("description", fm.Description),
		DockerImage: str("docker_image", fm.DockerImage),
		Body:        body,
	}
	switch x := fm.Dependencies.(type) {
	case nil:
	case string: // "dependencies: pandas" is a list of one
		s.Dependencies = []string{x}
	case []any:
		for i, d := range x {
			if ds, ok := d.(string); ok {
				s.Dependencies = append(s.Dependencies, ds)
			} else {
				errs = append(errs, errdefs.Field(fmt.Sprintf("dependencies[%d]", i), fmt.Sprintf("must be a string, not %T", d)))
			}
		}
	default:
		errs = append(errs, errdefs.Field("dependencies", "must be a list of strings"))
	}
	if err := s.Validate(); err != nil {
		errs = append(errs, err)
	}
	return s, errors.Join(errs...)
}

// split cuts a SKILL.md into its frontmatter and body.
func split(c string) (head, body string, err error) {
	c = strings.TrimPrefix(c, "\ufeff")
	first, rest, ok := cutLine(c)
	if !ok || strings.TrimRight(first, " \t") != "---" {
		return "", "", errdefs.Field("frontmatter", "SKILL.md must start with a line \"---\", then YAML (name, description), then \"---\"")
	}
	off := 0
	for {
		line, next, more := cutLine(rest[off:])
		if strings.TrimRight(line, " \t") == "---" {
			return rest[:off], strings.TrimLeft(next, "\r\n"), nil
		}
		if !more {
			break
		}
		off = len(rest) - len(next)
	}
	return "", "", errdefs.Field("frontmatter", "has no closing \"---\" line")
}

// cutLine returns s's first line without its line ending, the rest, and
// whether there was a line ending.
func cutLine(s string) (line, rest string, ok bool) {
	line, rest, ok = strings.Cut(s, "\n")
	return strings.TrimSuffix(line, "\r"), rest, ok
}

// Render returns the SKILL.md for s: its frontmatter, then its body.
func Render(s Skill) []byte {
	var b bytes.Buffer
	b.WriteString("---\n")
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	enc.Encode(s) // a struct of strings cannot fail to encode
	enc.Close()
	b.WriteString("---\n\n")
	body := strings.TrimLeft(s.Body, "\r\n")
	b.WriteString(body)
	if body != "" && !strings.HasSuffix(body, "\n") {
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// yamlMessage shortens a YAML library error to its message.
func yamlMessage(err error) string {
	return strings.TrimPrefix(err.Error(), "yaml: ")
}
