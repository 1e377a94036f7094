// Package units parses the sizes and CPU amounts that appear in
// configuration and task requests: IEC ("512MiB", "1GiB"), Kubernetes
// ("512Mi", "2Gi", "500m" CPU), decimal and plain numbers. It is the one
// parser of both; config keeps the text the user wrote beside the value.
package units

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

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

// ParseSize parses a byte size: a whole, non-negative number with an
// optional unit: plain bytes ("1048576"), IEC ("64KiB", "512MiB", "1GiB"),
// Kubernetes binary ("512Mi", "2Gi") or decimal ("500M", "1G", "10kB").
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, errors.New("empty size")
	}
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, fmt.Errorf("size %q must start with a whole number of bytes, e.g. 512MiB", s)
	}
	num, unit := t[:i], strings.TrimSpace(t[i:])
	mult, ok := sizeUnits[unit]
	if !ok {
		return 0, fmt.Errorf("size %q has unknown unit %q (use B, KiB, MiB, GiB, TiB, Ki, Mi, Gi, Ti, k, M, G or T)", s, unit)
	}
	v, err := strconv.ParseInt(num, 10, 64)
	if err != nil || v > math.MaxInt64/mult {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return v * mult, nil
}

// ParseCPU parses a CPU amount into millicores: "2" is 2000, "0.5" and
// "500m" are 500. Amounts finer than one millicore are refused.
func ParseCPU(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, errors.New("empty cpu amount")
	}
	if m, ok := strings.CutSuffix(t, "m"); ok {
		v, err := strconv.ParseInt(m, 10, 64)
		if err != nil || v < 0 {
			return 0, fmt.Errorf("cpu %q must be whole millicores, e.g. 500m", s)
		}
		return v, nil
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
	return w*1000 + f, nil
}

// FormatSize prints a byte count in IEC units, for messages.
func FormatSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}
