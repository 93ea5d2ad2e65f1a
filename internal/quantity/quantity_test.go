package quantity

import (
	"errors"
	"math"
	"testing"
)

func TestParse(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		err  error
	}{
		{in: "0", want: 0},
		{in: "512", want: 512},
		{in: "1Ki", want: 1 << 10},
		{in: "40Gi", want: 40 << 30},
		{in: "1.5Gi", want: 3 << 29},
		{in: "200Mi", want: 200 << 20},
		{in: "2Ti", want: 2 << 40},
		{in: "1Pi", want: 1 << 50},
		{in: "7Ei", want: 7 << 60},
		{in: "1k", want: 1000},
		{in: "1K", want: 1000},
		{in: "500M", want: 500_000_000},
		{in: "3G", want: 3_000_000_000},
		{in: "1T", want: 1_000_000_000_000},
		{in: "1e9", want: 1_000_000_000},
		{in: "0.5Ki", want: 512},
		{in: " 10Gi ", want: 10 << 30},
		{in: "9223372036854775807", want: math.MaxInt64},

		{in: "", err: ErrSyntax},
		{in: "Gi", err: ErrSyntax},
		{in: "-", err: ErrSyntax},
		{in: ".", err: ErrSyntax},
		{in: "10GB", err: ErrSyntax},
		{in: "10 Gi", err: ErrSyntax},
		{in: "ten", err: ErrSyntax},
		{in: "-1", err: ErrNegative},
		{in: "-40Gi", err: ErrNegative},
		{in: "1.5", err: ErrFractional},
		{in: "1m", err: ErrFractional},
		{in: "0.3Ki", err: ErrFractional},
		{in: "9223372036854775808", err: ErrOverflow},
		{in: "8Ei", err: ErrOverflow},
		{in: "100Ei", err: ErrOverflow},
		{in: "10E", err: ErrOverflow},
		{in: "1e30", err: ErrOverflow},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := Parse(tt.in)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("Parse(%q) = %d, %v; want error %v", tt.in, got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Parse(%q) = %d, %v; want %d", tt.in, got, err, tt.want)
			}
		})
	}
}

func TestParseErrorNamesInput(t *testing.T) {
	_, err := Parse("12XB")
	if err == nil || err.Error()[:len(`size "12XB"`)] != `size "12XB"` {
		t.Fatalf("error %v does not name the input", err)
	}
}

func TestFormat(t *testing.T) {
	tests := []struct {
		in   int64
		want string
	}{
		{0, "0"},
		{512, "512"},
		{1023, "1023"},
		{1024, "1Ki"},
		{1536, "1.5Ki"},
		{40 << 30, "40Gi"},
		{3 << 29, "1.5Gi"},
		{200 << 20, "200Mi"},
		{(1 << 30) - 1, "1Gi"},
		{(1 << 20) + 300<<10, "1.3Mi"},
		{5 << 40, "5Ti"},
		{3 << 50, "3Pi"},
		{math.MaxInt64, "8Ei"},
		{-2048, "-2Ki"},
		{math.MinInt64, "-8Ei"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := Format(tt.in); got != tt.want {
				t.Fatalf("Format(%d) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestFormatParseRoundTrip(t *testing.T) {
	for _, n := range []int64{0, 1, 512, 1 << 10, 40 << 30, 100 << 20, 7 << 60} {
		got, err := Parse(Format(n))
		if err != nil || got != n {
			t.Errorf("Parse(Format(%d)) = %d, %v", n, got, err)
		}
	}
}
