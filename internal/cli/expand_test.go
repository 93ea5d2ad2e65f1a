package cli

import (
	"reflect"
	"strings"
	"testing"
)

func TestExpand(t *testing.T) {
	tests := []struct {
		word string
		want []string
		err  string
	}{
		{word: "web01", want: []string{"web01"}},
		{word: "a-{1..3}", want: []string{"a-1", "a-2", "a-3"}},
		{word: "x{01..10}", want: []string{"x01", "x02", "x03", "x04", "x05", "x06", "x07", "x08", "x09", "x10"}},
		{word: "vdi-{001..003}", want: []string{"vdi-001", "vdi-002", "vdi-003"}},
		{word: "n{8..12}", want: []string{"n8", "n9", "n10", "n11", "n12"}},
		{word: "n{3..1}", want: []string{"n3", "n2", "n1"}},
		{word: "n{5..5}", want: []string{"n5"}},
		{word: "{1..2}-tail", want: []string{"1-tail", "2-tail"}},
		{word: "db-{a,b}", want: []string{"db-a", "db-b"}},
		{word: "r{1..2}-d{0..1}", want: []string{"r1-d0", "r1-d1", "r2-d0", "r2-d1"}},

		{word: "a-{1..3", err: "not closed"},
		{word: "a-1..3}", err: "has no '{'"},
		{word: "a-{{1..3}}", err: "not closed"},
		{word: "a-{}", err: "want {FROM..TO}"},
		{word: "a-{1}", err: "want {FROM..TO}"},
		{word: "a-{1..}", err: "not a non-negative integer"},
		{word: "a-{..3}", err: "not a non-negative integer"},
		{word: "a-{a..c}", err: "not a non-negative integer"},
		{word: "a-{-1..3}", err: "not a non-negative integer"},
		{word: "a-{1..2..3}", err: "not a non-negative integer"},
		{word: "a-{x,}", err: "empty alternative"},
		{word: "a-{1..100000}", err: "more than 5000"},
		{word: "a{1..100}-{1..100}", err: "more than 5000"},
	}
	for _, tt := range tests {
		t.Run(tt.word, func(t *testing.T) {
			got, err := expand(tt.word)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("expand(%q) = %v, %v; want error containing %q", tt.word, got, err, tt.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("expand(%q) = %v, %v; want %v", tt.word, got, err, tt.want)
			}
		})
	}
}

func TestExpandAll(t *testing.T) {
	got, err := expandAll([]string{"vdi-{001..500}"})
	if err != nil || len(got) != 500 || got[0] != "vdi-001" || got[499] != "vdi-500" {
		t.Fatalf("expandAll = %d names (%v…), %v", len(got), got[:min(3, len(got))], err)
	}
	if _, err := expandAll([]string{"a{1..2}", "a2"}); err == nil || !strings.Contains(err.Error(), `"a2" is given twice`) {
		t.Fatalf("duplicate: err = %v", err)
	}
	if _, err := expandAll([]string{"a{1..3000}", "b{1..3000}"}); err == nil {
		t.Fatal("6000 names accepted")
	}
}
