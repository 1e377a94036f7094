package units

import "testing"

func TestParseSize(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{"0", 0, false},
		{"1000", 1000, false},
		{"512MiB", 512 << 20, false},
		{"512Mi", 512 << 20, false},
		{"2Gi", 2 << 30, false},
		{"1GiB", 1 << 30, false},
		{"64KiB", 64 << 10, false},
		{"1TiB", 1 << 40, false},
		{"1.5Gi", 0, true}, // whole numbers only
		{"10MB", 10e6, false},
		{"10M", 10e6, false},
		{"3k", 3000, false},
		{"3K", 3000, false},
		{"7B", 7, false},
		{" 16 Mi ", 16 << 20, false},
		{"5m", 0, true}, // milli is not a size unit
		{"1kib", 0, true},
		{"9223372036854775807Ki", 0, true},
		{"99999999999999999999", 0, true},
		{"", 0, true},
		{"Mi", 0, true},
		{"abc", 0, true},
		{"-1", 0, true},
		{"-1Gi", 0, true},
		{"1Xi", 0, true},
		{"NaN", 0, true},
		{"Inf", 0, true},
		{"1e30", 0, true},
		{"9999999Ti", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseSize(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestParseCPU(t *testing.T) {
	tests := []struct {
		in      string
		want    int64
		wantErr bool
	}{
		{"2", 2000, false},
		{"0.5", 500, false},
		{"500m", 500, false},
		{"1m", 1, false},
		{" 1.25 ", 1250, false},
		{".5", 500, false},
		{"1.500", 1500, false},
		{"1.0005", 0, true},
		{"1.-5", 0, true},
		{"9223372036854775807", 0, true},
		{"0", 0, false}, // zero is a valid amount; callers that need more check it
		{"0m", 0, false},
		{"-1", 0, true},
		{"-5m", 0, true},
		{"0.5m", 0, true},
		{"m", 0, true},
		{"", 0, true},
		{"two", 0, true},
		{"2e9", 0, true},
		{"NaN", 0, true},
		{"Inf", 0, true},
		{"0.0001", 0, true}, // rounds to 0 millicores, which means "the default"
	}
	for _, tt := range tests {
		got, err := ParseCPU(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseCPU(%q) = %d, %v; want %d, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestFormatSize(t *testing.T) {
	tests := []struct {
		in   int64
		want string
	}{
		{0, "0 bytes"},
		{1, "1 bytes"},
		{1000, "1000 bytes"},
		{1024, "1KiB"},
		{1536, "1536 bytes"},
		{3 << 10, "3KiB"},
		{1 << 20, "1MiB"},
		{1<<20 + 1<<10, "1025KiB"},
		{512 << 20, "512MiB"},
		{1 << 30, "1GiB"},
		{5 << 30, "5GiB"},
		{1<<30 + 1<<20, "1025MiB"},
	}
	for _, tt := range tests {
		if got := FormatSize(tt.in); got != tt.want {
			t.Errorf("FormatSize(%d) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestFormatParseRoundTrip(t *testing.T) {
	for _, n := range []int64{1 << 10, 3 << 20, 7 << 30} {
		s := FormatSize(n)
		got, err := ParseSize(s)
		if err != nil || got != n {
			t.Errorf("ParseSize(FormatSize(%d)=%q) = %d, %v", n, s, got, err)
		}
	}
}
