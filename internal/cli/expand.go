package cli

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/quiverstorage/quiver/internal/api"
)

// maxExpansion bounds how many names one word may expand to: a clone
// request takes at most api.MaxBulkClones names.
const maxExpansion = api.MaxBulkClones

// expand returns the names a word stands for, as bash brace expansion would:
// "vdi-{001..500}" is vdi-001 … vdi-500 (a bound written with a leading zero
// pads every number to the wider bound), "{3..1}" counts down, "{a,b}" lists
// alternatives, and several groups in one word multiply ("r{1..2}-{a,b}").
// A word without braces is itself. Unbalanced or nested braces, an empty
// group and non-numeric ranges are errors, as is an expansion of more than
// maxExpansion names.
func expand(word string) ([]string, error) {
	names, err := expandFrom([]string{""}, word, word)
	if err != nil {
		return nil, fmt.Errorf("name pattern %q: %w", word, err)
	}
	return names, nil
}

// expandFrom appends every expansion of rest to each prefix.
func expandFrom(prefixes []string, rest, word string) ([]string, error) {
	open := strings.IndexAny(rest, "{}")
	if open < 0 {
		return appendAll(prefixes, []string{rest}), nil
	}
	if rest[open] == '}' {
		return nil, fmt.Errorf("'}' at offset %d has no '{'", len(word)-len(rest)+open)
	}
	closing := strings.IndexAny(rest[open+1:], "{}")
	if closing < 0 || rest[open+1+closing] == '{' {
		return nil, fmt.Errorf("'{' at offset %d is not closed (braces do not nest)", len(word)-len(rest)+open)
	}
	group := rest[open+1 : open+1+closing]
	alternatives, err := expandGroup(group)
	if err != nil {
		return nil, err
	}
	if len(prefixes)*len(alternatives) > maxExpansion {
		return nil, fmt.Errorf("expands to more than %d names", maxExpansion)
	}
	next := appendAll(prefixes, []string{rest[:open]})
	next = appendAll(next, alternatives)
	return expandFrom(next, rest[open+1+closing+1:], word)
}

// expandGroup expands the inside of one pair of braces.
func expandGroup(group string) ([]string, error) {
	if from, to, ok := strings.Cut(group, ".."); ok {
		return expandRange(from, to)
	}
	alternatives := strings.Split(group, ",")
	if len(alternatives) < 2 {
		return nil, fmt.Errorf("{%s}: want {FROM..TO} or {a,b,…}", group)
	}
	for _, a := range alternatives {
		if a == "" {
			return nil, fmt.Errorf("{%s}: empty alternative", group)
		}
	}
	return alternatives, nil
}

// expandRange expands {from..to} over non-negative integers.
func expandRange(from, to string) ([]string, error) {
	lo, err := rangeBound(from)
	if err != nil {
		return nil, fmt.Errorf("{%s..%s}: %w", from, to, err)
	}
	hi, err := rangeBound(to)
	if err != nil {
		return nil, fmt.Errorf("{%s..%s}: %w", from, to, err)
	}
	step := 1
	count := hi - lo + 1
	if hi < lo {
		step, count = -1, lo-hi+1
	}
	if count > maxExpansion {
		return nil, fmt.Errorf("{%s..%s}: expands to %d names, more than %d", from, to, count, maxExpansion)
	}
	width := 0
	if padded(from) || padded(to) {
		width = max(len(from), len(to))
	}
	out := make([]string, 0, count)
	for i, n := 0, lo; i < count; i, n = i+1, n+step {
		out = append(out, fmt.Sprintf("%0*d", width, n))
	}
	return out, nil
}

func rangeBound(s string) (int, error) {
	if s == "" || strings.Trim(s, "0123456789") != "" {
		return 0, fmt.Errorf("bound %q is not a non-negative integer", s)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n > 1e9 {
		return 0, fmt.Errorf("bound %q is too large", s)
	}
	return n, nil
}

// padded reports whether a bound asks for zero padding, as "001" does.
func padded(bound string) bool { return len(bound) > 1 && bound[0] == '0' }

// appendAll returns every prefix followed by every suffix, prefixes major.
func appendAll(prefixes, suffixes []string) []string {
	out := make([]string, 0, len(prefixes)*len(suffixes))
	for _, p := range prefixes {
		for _, s := range suffixes {
			out = append(out, p+s)
		}
	}
	return out
}

// expandAll expands every word and refuses duplicate names, which would
// make one clone request ask twice for the same volume.
func expandAll(words []string) ([]string, error) {
	var names []string
	seen := make(map[string]bool)
	for _, w := range words {
		expanded, err := expand(w)
		if err != nil {
			return nil, err
		}
		for _, n := range expanded {
			if seen[n] {
				return nil, fmt.Errorf("name %q is given twice", n)
			}
			seen[n] = true
			names = append(names, n)
		}
		if len(names) > maxExpansion {
			return nil, fmt.Errorf("%d names, more than the %d one clone may make", len(names), maxExpansion)
		}
	}
	return names, nil
}
