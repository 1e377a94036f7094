package config

import (
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

func TestParseSize(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr string
	}{
		{in: "0", want: 0},
		{in: "1048576", want: 1 << 20},
		{in: "100B", want: 100},
		{in: "64KiB", want: 64 << 10},
		{in: "512MiB", want: 512 << 20},
		{in: "1GiB", want: 1 << 30},
		{in: "2TiB", want: 2 << 40},
		{in: "512Mi", want: 512 << 20},
		{in: "2Gi", want: 2 << 30},
		{in: "4Ki", want: 4 << 10},
		{in: "500M", want: 500e6},
		{in: "1G", want: 1e9},
		{in: "10kB", want: 10e3},
		{in: "3k", want: 3e3},
		{in: " 8 MiB ", want: 8 << 20},
		{in: "", wantErr: "empty size"},
		{in: "MiB", wantErr: "must start with a whole number"},
		{in: "-1", wantErr: "must start with a whole number"},
		{in: "1.5Gi", wantErr: `unknown unit ".5Gi"`},
		{in: "10m", wantErr: `unknown unit "m"`},
		{in: "10 bytes", wantErr: "unknown unit"},
		{in: "9223372036854775807", want: 1<<63 - 1},
		{in: "9223372036854775808", wantErr: "too large"},
		{in: "8589934592Gi", wantErr: "too large"},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseSize(%q) error = %v, want one containing %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseSize(%q): %v", tt.in, err)
			continue
		}
		if got.Bytes() != tt.want {
			t.Errorf("ParseSize(%q) = %d bytes, want %d", tt.in, got.Bytes(), tt.want)
		}
		if got.String() != strings.TrimSpace(tt.in) {
			t.Errorf("ParseSize(%q).String() = %q, want the text as written", tt.in, got.String())
		}
	}
}

func TestSizeEqualAndString(t *testing.T) {
	if !mustSize("1Gi").Equal(mustSize("1GiB")) {
		t.Error("1Gi and 1GiB are not Equal")
	}
	if mustSize("1G").Equal(mustSize("1Gi")) {
		t.Error("1G and 1Gi are Equal")
	}
	if got := (Size{n: 42}).String(); got != "42" {
		t.Errorf("String of a Size without text = %q, want 42", got)
	}
}

func TestParseCPU(t *testing.T) {
	tests := []struct {
		in      string
		want    CPU
		wantErr string
	}{
		{in: "2", want: 2000},
		{in: "0.5", want: 500},
		{in: ".25", want: 250},
		{in: "1.", want: 1000},
		{in: "1.500", want: 1500},
		{in: "500m", want: 500},
		{in: "2000m", want: 2000},
		{in: "0", want: 0},
		{in: "0.001", want: 1},
		{in: "", wantErr: "empty"},
		{in: "0.0005", wantErr: "finer than one millicore"},
		{in: "-1", wantErr: "number of cores"},
		{in: "1.-5", wantErr: "number of cores"},
		{in: "1.5m", wantErr: "whole millicores"},
		{in: "-5m", wantErr: "whole millicores"},
		{in: "two", wantErr: "number of cores"},
		{in: "1e3", wantErr: "number of cores"},
	}
	for _, tt := range tests {
		got, err := ParseCPU(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseCPU(%q) error = %v, want one containing %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseCPU(%q): %v", tt.in, err)
			continue
		}
		if got != tt.want {
			t.Errorf("ParseCPU(%q) = %d millis, want %d", tt.in, got.Millis(), tt.want)
		}
	}
}

func TestCPUString(t *testing.T) {
	for c, want := range map[CPU]string{2000: "2", 500: "500m", 1500: "1500m", 0: "0"} {
		if got := c.String(); got != want {
			t.Errorf("CPU(%d).String() = %q, want %q", c, got, want)
		}
	}
}

// TestUnitsYAML checks the YAML forms, including bare numbers, and that
// the types round-trip through Marshal.
func TestUnitsYAML(t *testing.T) {
	var v struct {
		Size Size     `yaml:"size"`
		Num  Size     `yaml:"num"`
		CPU  CPU      `yaml:"cpu"`
		Half CPU      `yaml:"half"`
		Dur  Duration `yaml:"dur"`
	}
	in := "size: 2Gi\nnum: 1024\ncpu: 2\nhalf: 0.5\ndur: 1h30m\n"
	if err := yaml.Unmarshal([]byte(in), &v); err != nil {
		t.Fatal(err)
	}
	if v.Size.Bytes() != 2<<30 || v.Num.Bytes() != 1024 || v.CPU != 2000 || v.Half != 500 || time.Duration(v.Dur) != 90*time.Minute {
		t.Errorf("decoded %+v", v)
	}
	out, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	want := "size: 2Gi\nnum: \"1024\"\ncpu: \"2\"\nhalf: 500m\ndur: 1h30m0s\n"
	if string(out) != want {
		t.Errorf("Marshal = %q, want %q", out, want)
	}

	for _, bad := range []string{"dur: 30\n", "dur: soon\n", "size: [1]\n", "cpu: {a: 1}\n", "dur: [1s]\n"} {
		if err := yaml.Unmarshal([]byte(bad), &v); err == nil {
			t.Errorf("Unmarshal(%q) succeeded, want an error", bad)
		}
	}
}
