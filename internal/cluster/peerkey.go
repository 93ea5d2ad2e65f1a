package cluster

import (
	"crypto/hmac"
	"crypto/sha256"
)

// PeerKey is the key that signs the API requests a node carries to another
// node for its caller (apiserver's hops, docs/cluster.md "Any node's
// API"): derived from the cluster token, which only the cluster's nodes
// hold, and never the token itself, so that a hop reveals nothing of it.
func (c Config) PeerKey() ([]byte, error) {
	token, err := c.readToken()
	if err != nil {
		return nil, err
	}
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("quiver api hop " + c.ClusterName))
	return m.Sum(nil), nil
}
