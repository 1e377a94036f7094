package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/corral-dev/corral/internal/units"
)

// Size is a byte count written as a string: plain bytes ("1048576"), IEC
// ("64KiB", "512MiB", "1GiB"), Kubernetes binary ("512Mi", "2Gi") or decimal
// ("500M", "1G", "10kB"). It keeps both the parsed value and the text the
// user wrote, because the kubernetes runtime passes quantities on as written.
// The zero Size is 0 bytes.
type Size struct {
	n    int64
	text string
}

// ParseSize parses a size string with units.ParseSize, keeping the text.
func ParseSize(s string) (Size, error) {
	n, err := units.ParseSize(s)
	if err != nil {
		return Size{}, err
	}
	return Size{n: n, text: strings.TrimSpace(s)}, nil
}

// Bytes returns the size in bytes.
func (s Size) Bytes() int64 { return s.n }

// String returns the size as written, or as plain bytes if it was built
// without text.
func (s Size) String() string {
	if s.text == "" {
		return strconv.FormatInt(s.n, 10)
	}
	return s.text
}

// Equal reports whether two sizes are the same number of bytes, so "1Gi"
// equals "1GiB". go-cmp uses it.
func (s Size) Equal(o Size) bool { return s.n == o.n }

// UnmarshalYAML parses a YAML scalar with ParseSize.
func (s *Size) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return errors.New("size must be a string such as 512MiB")
	}
	v, err := ParseSize(n.Value)
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// MarshalYAML writes the size as text.
func (s Size) MarshalYAML() (any, error) { return s.String(), nil }

// CPU is an amount of CPU in millicores (1000 = one core), written as
// Kubernetes does: "2", "0.5" or "500m".
type CPU int64

// ParseCPU parses a CPU string with units.ParseCPU.
func ParseCPU(s string) (CPU, error) {
	n, err := units.ParseCPU(s)
	return CPU(n), err
}

// Millis returns the amount in millicores.
func (c CPU) Millis() int64 { return int64(c) }

// String formats the amount as Kubernetes would: "2" for whole cores,
// "500m" otherwise.
func (c CPU) String() string {
	if c%1000 == 0 {
		return strconv.FormatInt(int64(c)/1000, 10)
	}
	return strconv.FormatInt(int64(c), 10) + "m"
}

// UnmarshalYAML parses a YAML scalar with ParseCPU; a bare YAML number such
// as 2 or 0.5 is accepted too.
func (c *CPU) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return errors.New(`cpu must be a string such as "2" or "500m"`)
	}
	v, err := ParseCPU(n.Value)
	if err != nil {
		return err
	}
	*c = v
	return nil
}

// MarshalYAML writes the amount as text.
func (c CPU) MarshalYAML() (any, error) { return c.String(), nil }

// Duration is a time.Duration written as a Go duration string ("30s",
// "5m", "1h30m"). Convert with time.Duration(d).
type Duration time.Duration

// String formats the duration as time.Duration does.
func (d Duration) String() string { return time.Duration(d).String() }

// UnmarshalYAML parses a YAML scalar with time.ParseDuration.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return errors.New(`duration must be a string such as "30s"`)
	}
	v, err := time.ParseDuration(strings.TrimSpace(n.Value))
	if err != nil {
		return fmt.Errorf("duration %q must be a Go duration such as 30s, 5m or 1h30m", n.Value)
	}
	*d = Duration(v)
	return nil
}

// MarshalYAML writes the duration as text.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }
