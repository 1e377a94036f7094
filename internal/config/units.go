package config

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
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

// sizeUnits maps every accepted suffix to its multiplier. Suffixes are
// case-sensitive, as in Kubernetes: "m" would be milli, so it is refused.
var sizeUnits = map[string]int64{
	"": 1, "B": 1,
	"k": 1e3, "K": 1e3, "kB": 1e3, "KB": 1e3,
	"M": 1e6, "MB": 1e6,
	"G": 1e9, "GB": 1e9,
	"T": 1e12, "TB": 1e12,
	"Ki": 1 << 10, "KiB": 1 << 10,
	"Mi": 1 << 20, "MiB": 1 << 20,
	"Gi": 1 << 30, "GiB": 1 << 30,
	"Ti": 1 << 40, "TiB": 1 << 40,
}

// ParseSize parses a size string. It accepts a whole, non-negative number
// with an optional unit from the list on Size.
func ParseSize(s string) (Size, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return Size{}, errors.New("empty size")
	}
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	if i == 0 {
		return Size{}, fmt.Errorf("size %q must start with a whole number of bytes, e.g. 512MiB", s)
	}
	num, unit := t[:i], strings.TrimSpace(t[i:])
	mult, ok := sizeUnits[unit]
	if !ok {
		return Size{}, fmt.Errorf("size %q has unknown unit %q (use B, KiB, MiB, GiB, TiB, Ki, Mi, Gi, Ti, k, M, G or T)", s, unit)
	}
	v, err := strconv.ParseInt(num, 10, 64)
	if err != nil || v > math.MaxInt64/mult {
		return Size{}, fmt.Errorf("size %q is too large", s)
	}
	return Size{n: v * mult, text: t}, nil
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

// ParseCPU parses a CPU string. Amounts finer than one millicore are refused.
func ParseCPU(s string) (CPU, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, errors.New("empty cpu amount")
	}
	if m, ok := strings.CutSuffix(t, "m"); ok {
		v, err := strconv.ParseInt(m, 10, 64)
		if err != nil || v < 0 {
			return 0, fmt.Errorf("cpu %q must be whole millicores, e.g. 500m", s)
		}
		return CPU(v), nil
	}
	whole, frac, _ := strings.Cut(t, ".")
	if whole == "" {
		whole = "0"
	}
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || w < 0 || w > math.MaxInt64/1000 || strings.ContainsAny(frac, "+-") {
		return 0, fmt.Errorf("cpu %q must be a number of cores (2, 0.5) or millicores (500m)", s)
	}
	frac = strings.TrimRight(frac, "0")
	if len(frac) > 3 {
		return 0, fmt.Errorf("cpu %q is finer than one millicore", s)
	}
	var f int64
	if frac != "" {
		f, err = strconv.ParseInt(frac+strings.Repeat("0", 3-len(frac)), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cpu %q must be a number of cores (2, 0.5) or millicores (500m)", s)
		}
	}
	return CPU(w*1000 + f), nil
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
