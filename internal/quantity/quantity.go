package quantity

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"gopkg.in/inf.v0"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Errors of Parse, wrapped with the text that broke the rule; test with
// errors.Is.
var (
	ErrSyntax     = errors.New("not a size")
	ErrNegative   = errors.New("must not be negative")
	ErrFractional = errors.New("must be a whole number of bytes")
	ErrOverflow   = errors.New("too large")
)

var maxInt64 = inf.NewDec(math.MaxInt64, 0)

// Parse returns the number of bytes s stands for. s is a Kubernetes quantity:
// plain bytes ("512"), binary suffixes Ki Mi Gi Ti Pi Ei (powers of 1024) or
// decimal suffixes k M G T P E (powers of 1000; "K" is read as "k"), with an
// optional fraction ("1.5Gi") or exponent ("1e9").
//
// Zero is accepted; whether a size may be zero is the server's rule. Negative
// values, values that are not whole bytes ("1.5", "1m") and values above
// math.MaxInt64 are refused. Fractions are read exactly down to 1e-9 byte,
// the precision of the Kubernetes parser.
func Parse(s string) (int64, error) {
	text := strings.TrimSpace(s)
	if strings.HasSuffix(text, "K") {
		// Kubernetes spells the decimal kilo "k"; people often type "K".
		text = strings.TrimSuffix(text, "K") + "k"
	}
	q, err := resource.ParseQuantity(text)
	if err != nil || !strings.ContainsAny(text, "0123456789") {
		// The parser reads a bare suffix ("Gi") as zero; a size needs digits.
		return 0, fmt.Errorf("size %q: %w (want bytes or a number with a suffix such as Ki, Mi, Gi, Ti, Pi, K, M, G, T, P)", s, ErrSyntax)
	}
	if q.Sign() < 0 {
		return 0, fmt.Errorf("size %q: %w", s, ErrNegative)
	}
	dec := q.AsDec()
	whole := new(inf.Dec).Round(dec, 0, inf.RoundDown)
	if whole.Cmp(dec) != 0 {
		if strings.HasSuffix(text, "m") {
			return 0, fmt.Errorf("size %q: %w (m is milli, 1/1000; use M for 10^6 or Mi for 2^20)", s, ErrFractional)
		}
		return 0, fmt.Errorf("size %q: %w", s, ErrFractional)
	}
	// The parser caps binary-suffixed values at MaxInt64 instead of failing,
	// so reaching the cap exactly counts as overflow for them: MaxInt64 is
	// odd and no whole number of Ki can equal it.
	if whole.Cmp(maxInt64) > 0 || (q.Format == resource.BinarySI && whole.Cmp(maxInt64) == 0) {
		return 0, fmt.Errorf("size %q: %w (the largest is %d bytes, about 8Ei)", s, ErrOverflow, int64(math.MaxInt64))
	}
	n, ok := whole.Unscaled()
	if !ok || whole.Scale() != 0 {
		// Round(…, 0, …) leaves scale 0, so this is unreachable for values
		// that passed the range check; keep the check rather than trust it.
		return 0, fmt.Errorf("size %q: %w", s, ErrOverflow)
	}
	return n, nil
}

// binaryUnits are the suffixes Format uses, each 1024 times the one before.
var binaryUnits = []string{"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"}

// Format renders n bytes for people, in the largest binary unit not above
// it: exact values keep no decimals ("40Gi", "512"), others show at most one
// ("1.5Gi", "2.3Ki"). It is for display only; Parse(Format(n)) is n only
// when Format shows no decimals.
func Format(n int64) string {
	if n < 0 {
		if n == math.MinInt64 {
			return "-8Ei"
		}
		return "-" + Format(-n)
	}
	unit := 0
	for unit+1 < len(binaryUnits) && n >= int64(1)<<(10*(unit+1)) {
		unit++
	}
	if unit == 0 {
		return strconv.FormatInt(n, 10)
	}
	size := int64(1) << (10 * unit)
	if n%size == 0 {
		return strconv.FormatInt(n/size, 10) + binaryUnits[unit]
	}
	v := float64(n) / float64(size)
	text := strconv.FormatFloat(v, 'f', 1, 64)
	if text == "1024.0" && unit+1 < len(binaryUnits) {
		// 1023.96Mi rounds to 1024Mi: say 1Gi instead.
		return "1" + binaryUnits[unit+1]
	}
	return strings.TrimSuffix(text, ".0") + binaryUnits[unit]
}
