package skill

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/corral-dev/corral/internal/errdefs"
)

func TestParse(t *testing.T) {
	in := "---\nname: expense-analyzer\ndescription: Categorise bank statement rows and total them.\ndocker_image: python:3.12-slim\ndependencies:\n  - pandas\n  - matplotlib\nlicense: MIT\n---\n\n# Expense analyzer\n\nRun main.py.\n"
	got, err := Parse([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := Skill{
		Name: "expense-analyzer", Description: "Categorise bank statement rows and total them.",
		DockerImage: "python:3.12-slim", Dependencies: []string{"pandas", "matplotlib"},
		Body: "# Expense analyzer\n\nRun main.py.\n",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Parse (-want +got):\n%s", diff)
	}
	// Render and Parse round-trip.
	again, err := Parse(Render(got))
	if err != nil {
		t.Fatalf("parse rendered: %v\n%s", err, Render(got))
	}
	if diff := cmp.Diff(got, again); diff != "" {
		t.Errorf("round trip (-first +second):\n%s", diff)
	}
}

func TestParseCRLFAndSingleDependency(t *testing.T) {
	got, err := Parse([]byte("---\r\nname: a1\r\ndescription: x\r\ndependencies: jq\r\n---\r\nbody\r\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "a1" || !slices.Equal(got.Dependencies, []string{"jq"}) || got.Body != "body\r\n" {
		t.Errorf("got %+v", got)
	}
}

func TestParseErrors(t *testing.T) {
	long := strings.Repeat("a", 65)
	for _, tc := range []struct {
		name, in string
		fields   []string
	}{
		{"no frontmatter", "# just markdown\n", []string{"frontmatter"}},
		{"unclosed", "---\nname: a\ndescription: b\n", []string{"frontmatter"}},
		{"not yaml", "---\nname: [a\n---\n", []string{"frontmatter"}},
		{"not a mapping", "---\n- a\n- b\n---\n", []string{"frontmatter"}},
		{"empty", "---\n---\n", []string{"frontmatter"}},
		{"missing both", "---\nlicense: MIT\n---\n", []string{"name", "description"}},
		{"upper case", "---\nname: Expense\ndescription: x\n---\n", []string{"name"}},
		{"underscore", "---\nname: a_b\ndescription: x\n---\n", []string{"name"}},
		{"leading hyphen", "---\nname: -a\ndescription: x\n---\n", []string{"name"}},
		{"dots", "---\nname: ../x\ndescription: x\n---\n", []string{"name"}},
		{"too long", "---\nname: " + long + "\ndescription: x\n---\n", []string{"name"}},
		{"description too long", "---\nname: a\ndescription: " + strings.Repeat("é", 1025) + "\n---\n", []string{"description"}},
		{"blank description", "---\nname: a\ndescription: '  '\n---\n", []string{"description"}},
		{"wrong types", "---\nname: 12\ndescription: {a: b}\ndependencies: [1, x]\n---\n", []string{"name", "description", "dependencies[0]", "name", "description"}},
		{"bad image", "---\nname: a\ndescription: x\ndocker_image: 'a b'\n---\n", []string{"docker_image"}},
		{"nul", "---\nname: a\x00\ndescription: x\n---\n", []string{"content"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.in))
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("error %v is not ErrInvalidArgument", err)
			}
			var fields []string
			walk(err, func(fe *errdefs.FieldError) { fields = append(fields, fe.Field) })
			slices.Sort(fields)
			want := slices.Clone(tc.fields)
			slices.Sort(want)
			if !slices.Equal(fields, want) {
				t.Errorf("fields %v, want %v (error: %v)", fields, want, err)
			}
		})
	}
}

func TestCheckName(t *testing.T) {
	for name, ok := range map[string]bool{
		"a": true, "expense-analyzer": true, "x2": true, "9lives": true, strings.Repeat("a", 64): true,
		"": false, "A": false, "a b": false, "a/b": false, "-a": false, "a.b": false, strings.Repeat("a", 65): false, "é": false,
	} {
		if err := CheckName(name); (err == nil) != ok {
			t.Errorf("CheckName(%q) = %v, want ok=%v", name, err, ok)
		}
	}
}

func TestSummary(t *testing.T) {
	s := Skill{Description: "  First line here.\nSecond line."}
	if got := s.Summary(100); got != "First line here." {
		t.Errorf("Summary = %q", got)
	}
	if got := (Skill{Description: "ééééé"}).Summary(7); got != "éé…" {
		t.Errorf("Summary cut = %q", got)
	}
}

func walk(err error, fn func(*errdefs.FieldError)) {
	if fe, ok := err.(*errdefs.FieldError); ok {
		fn(fe)
		return
	}
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			walk(e, fn)
		}
	case interface{ Unwrap() error }:
		if e := u.Unwrap(); e != nil {
			walk(e, fn)
		}
	}
}
