package cluster

import (
	"strings"
	"testing"
	"time"
)

// TestHop: a name a node signs for its hop to the primary opens on the
// cluster's nodes, as the client's name, within hopSkew of its time; a
// mark that a client makes, changes or moves to another name, another
// cluster's, or one out of time does not open, and neither does a name
// without a mark.
func TestHop(t *testing.T) {
	k := deriveKeys("cluster-token-of-the-test-0123", "alpha")
	now := time.Unix(1_800_000_000, 0)
	for _, export := range []string{"web01/root/0123456789abcdef", "web01/root", "web01@snap/root/tok"} {
		signed := k.signHop(export, now)
		if !strings.HasPrefix(signed, export+"/"+hopPrefix) {
			t.Fatalf("signHop(%q) = %q: want the name, then its mark", export, signed)
		}
		for _, at := range []time.Duration{0, hopSkew, -hopSkew} {
			if got, ok := k.openHop(signed, now.Add(at)); !ok || got != export {
				t.Errorf("%q opened %v from its signing: %q, %v; want %q", signed, at, got, ok, export)
			}
		}
		mark := signed[len(export)+1:]
		sig := mark[strings.LastIndexByte(mark, '.')+1:]
		flipped := "A"
		if sig[0] == 'A' {
			flipped = "B"
		}
		for what, tc := range map[string]struct {
			keys nodeKeys
			name string
			at   time.Duration
		}{
			"stale":                   {k, signed, hopSkew + time.Second},
			"from the future":         {k, signed, -hopSkew - time.Second},
			"another cluster token":   {deriveKeys("another-token-of-16-chars", "alpha"), signed, 0},
			"another cluster name":    {deriveKeys("cluster-token-of-the-test-0123", "beta"), signed, 0},
			"a node without the key":  {nodeKeys{}, signed, 0},
			"moved to another name":   {k, "web02/root/0123456789abcdef/" + mark, 0},
			"another token":           {k, export + "x/" + mark, 0},
			"its time changed":        {k, export + "/" + hopPrefix + "1800000010." + sig, 0},
			"a forged signature":      {k, export + "/" + strings.Replace(mark, sig, flipped+sig[1:], 1), 0},
			"made by a client":        {k, export + "/" + hopPrefix + "1800000000.c2lnbmVkIGJ5IG1l", 0},
			"no signature":            {k, export + "/" + hopPrefix + "1800000000", 0},
			"an empty signature":      {k, export + "/" + hopPrefix + "1800000000.", 0},
			"no mark":                 {k, export, 0},
			"the mark alone":          {k, mark, 0},
			"another version of mark": {k, export + "/hop2." + strings.TrimPrefix(mark, hopPrefix), 0},
		} {
			if got, ok := tc.keys.openHop(tc.name, now.Add(tc.at)); ok {
				t.Errorf("%s: %q opened as %q", what, tc.name, got)
			}
		}
	}
}
