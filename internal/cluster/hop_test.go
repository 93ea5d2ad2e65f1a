package cluster

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestHop: a name a node signs for its hop to the primary opens on the
// cluster's nodes, as the client's name, within hopSkew of its time; a
// mark that a client makes, changes or moves to another name, another
// cluster's, and a name without a mark are not a hop; a node's mark out of
// time is one, refused as such (the nodes' clocks apart).
func TestHop(t *testing.T) {
	k := deriveKeys("cluster-token-of-the-test-0123", "alpha")
	now := time.Unix(1_800_000_000, 0)
	for _, export := range []string{"web01/root/0123456789abcdef", "web01/root", "web01@snap/root/tok"} {
		signed := k.signHop(export, now)
		if !strings.HasPrefix(signed, export+"/"+hopPrefix) {
			t.Fatalf("signHop(%q) = %q: want the name, then its mark", export, signed)
		}
		for _, at := range []time.Duration{0, hopSkew, -hopSkew} {
			if got, err := k.openHop(signed, now.Add(at)); err != nil || got != export {
				t.Errorf("%q opened %v from its signing: %q, %v; want %q", signed, at, got, err, export)
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
			want error
		}{
			"stale":                   {k, signed, hopSkew + time.Second, errHopTime},
			"from the future":         {k, signed, -hopSkew - time.Second, errHopTime},
			"another cluster token":   {deriveKeys("another-token-of-16-chars", "alpha"), signed, 0, errNotHop},
			"another cluster name":    {deriveKeys("cluster-token-of-the-test-0123", "beta"), signed, 0, errNotHop},
			"a node without the key":  {nodeKeys{}, signed, 0, errNotHop},
			"moved to another name":   {k, "web02/root/0123456789abcdef/" + mark, 0, errNotHop},
			"another token":           {k, export + "x/" + mark, 0, errNotHop},
			"its time changed":        {k, export + "/" + hopPrefix + "1800000010." + sig, 0, errNotHop},
			"a forged signature":      {k, export + "/" + strings.Replace(mark, sig, flipped+sig[1:], 1), 0, errNotHop},
			"made by a client":        {k, export + "/" + hopPrefix + "1800000000.c2lnbmVkIGJ5IG1l", 0, errNotHop},
			"no signature":            {k, export + "/" + hopPrefix + "1800000000", 0, errNotHop},
			"an empty signature":      {k, export + "/" + hopPrefix + "1800000000.", 0, errNotHop},
			"no mark":                 {k, export, 0, errNotHop},
			"the mark alone":          {k, mark, 0, errNotHop},
			"another version of mark": {k, export + "/hop2." + strings.TrimPrefix(mark, hopPrefix), 0, errNotHop},
		} {
			if got, err := tc.keys.openHop(tc.name, now.Add(tc.at)); !errors.Is(err, tc.want) {
				t.Errorf("%s: %q opened as %q, %v; want %v", what, tc.name, got, err, tc.want)
			}
		}
	}
}
