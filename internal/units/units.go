// Package units parses the sizes and CPU amounts that appear in
// configuration and task requests: IEC ("512MiB", "1GiB"), Kubernetes
// ("512Mi", "2Gi", "500m" CPU) and plain numbers.
package units

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

var sizeSuffixes = []struct {
	s string
	m int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	{"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
	{"B", 1},
}

// ParseSize parses a byte size such as "2Gi", "512MiB", "64KiB" or "1000".
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, suf := range sizeSuffixes {
		if strings.HasSuffix(t, suf.s) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, suf.s)), suf.m
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, fmt.Errorf("%q is not a size (examples: 512MiB, 2Gi, 1048576)", s)
	}
	v := f * float64(mult)
	if v > math.MaxInt64/2 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return int64(v), nil
}

// ParseCPU parses a CPU amount in millicores: "2" is 2000, "0.5" and "500m" are 500.
func ParseCPU(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if m, ok := strings.CutSuffix(t, "m"); ok {
		n, err := strconv.ParseInt(m, 10, 64)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("%q is not a CPU amount (examples: 2, 0.5, 500m)", s)
		}
		return n, nil
	}
	f, err := strconv.ParseFloat(t, 64)
	// Written as !(in range) so NaN fails too; under 1 millicore is 0, the default.
	if err != nil || !(f > 0 && f <= 1e6) || math.Round(f*1000) < 1 {
		return 0, fmt.Errorf("%q is not a CPU amount (examples: 2, 0.5, 500m)", s)
	}
	return int64(math.Round(f * 1000)), nil
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
