package cluster

import (
	"bytes"
	"errors"
	"testing"
)

// TestSealing: a sealed value opens with its cluster's key under its own
// etcd key only, and holds nothing of the plain text.
func TestSealing(t *testing.T) {
	k := deriveKeys("cluster-token-of-the-test-0123", "alpha")
	plain := []byte(`{"attachments":[{"token":"secret-token-0123456789"}]}`)
	sealed, err := k.seal("/quiver/attach/web01", plain)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte("secret-token")) {
		t.Fatalf("sealed value shows the token: %s", sealed)
	}
	got, err := k.unseal("/quiver/attach/web01", sealed)
	if err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("unseal: %q, %v", got, err)
	}
	for name, tc := range map[string]struct {
		keys  nodeKeys
		key   string
		value []byte
	}{
		"another etcd key":      {k, "/quiver/attach/web02", sealed},
		"another cluster token": {deriveKeys("another-token-of-16-chars", "alpha"), "/quiver/attach/web01", sealed},
		"another cluster name":  {deriveKeys("cluster-token-of-the-test-0123", "beta"), "/quiver/attach/web01", sealed},
		"plain text":            {k, "/quiver/attach/web01", plain},
		"damaged":               {k, "/quiver/attach/web01", append(bytes.Clone(sealed[:len(sealed)-2]), 'A', 'A')},
		"truncated":             {k, "/quiver/attach/web01", []byte(sealedPrefix + "AAAA")},
	} {
		if _, err := tc.keys.unseal(tc.key, tc.value); !errors.Is(err, errSealed) {
			t.Errorf("%s: %v, want errSealed", name, err)
		}
	}
	if got, err := k.unseal("/quiver/attach/web01", nil); got != nil || err != nil {
		t.Errorf("empty value: %q, %v; want none", got, err)
	}
	if bytes.Equal(k.sealing, k.replication) {
		t.Error("the sealing and replication keys are one key")
	}
}
