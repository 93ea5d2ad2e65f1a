package cluster

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// Secrets in etcd (docs/cluster.md, "Replication sessions"): etcd holds no
// credential that opens a disk. A client reaching etcd's port (an external
// etcd) reads nothing it could use against a node's NBD port:
//
//   - the copies' replication attachments never leave their node: a
//     primary opens a replication session with a credential signed by the
//     replication key (replica.Credential), never with a token;
//   - the attachments a primary publishes for its successor (attach/<v>)
//     are sealed with the sealing key (AES-256-GCM, the key's name as
//     additional data, so a sealed value moved to another key does not
//     open).
//
// A third key signs the opens one node forwards to another for its client
// (hop.go); it opens nothing.
//
// The keys are derived from the cluster token, which only the cluster's
// nodes hold (--cluster-token-file), each for its own purpose, so that
// knowing one reveals neither the token nor the other.
type nodeKeys struct {
	replication []byte
	sealing     []byte
	hop         []byte
}

func deriveKeys(token, clusterName string) nodeKeys {
	derive := func(purpose string) []byte {
		m := hmac.New(sha256.New, []byte(token))
		m.Write([]byte("quiver " + purpose + " " + clusterName))
		return m.Sum(nil)
	}
	return nodeKeys{replication: derive("replication session"), sealing: derive("etcd sealing"), hop: derive("nbd hop")}
}

// ReplicationKey is the key that signs and checks replication sessions
// (replica.Credential): the cluster's nodes share it, nothing else has it.
func (n *Node) ReplicationKey() []byte { return n.keys.replication }

// sealedPrefix marks a sealed value; the version is part of it.
const sealedPrefix = "qvsealed1:"

// errSealed: a sealed value does not open with this cluster's key (another
// cluster's token, a value moved to another key, or damage).
var errSealed = errors.New("sealed value does not open with this cluster's key")

// seal encrypts plain for etcd key k.
func (k nodeKeys) seal(key string, plain []byte) ([]byte, error) {
	aead, err := k.aead()
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	out := aead.Seal(nonce, nonce, plain, []byte(key))
	return []byte(sealedPrefix + base64.RawStdEncoding.EncodeToString(out)), nil
}

// unseal opens a value seal made for etcd key k. An empty value is none.
func (k nodeKeys) unseal(key string, sealed []byte) ([]byte, error) {
	if len(sealed) == 0 {
		return nil, nil
	}
	s, ok := strings.CutPrefix(string(sealed), sealedPrefix)
	if !ok {
		return nil, fmt.Errorf("etcd key %s: not sealed: %w", key, errSealed)
	}
	raw, err := base64.RawStdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("etcd key %s: %w: %w", key, errSealed, err)
	}
	aead, err := k.aead()
	if err != nil {
		return nil, err
	}
	if len(raw) < aead.NonceSize() {
		return nil, fmt.Errorf("etcd key %s: %w", key, errSealed)
	}
	plain, err := aead.Open(nil, raw[:aead.NonceSize()], raw[aead.NonceSize():], []byte(key))
	if err != nil {
		return nil, fmt.Errorf("etcd key %s: %w", key, errSealed)
	}
	return plain, nil
}

func (k nodeKeys) aead() (cipher.AEAD, error) {
	if len(k.sealing) != 32 {
		return nil, errors.New("no sealing key: the node has not joined a cluster")
	}
	b, err := aes.NewCipher(k.sealing)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

// Instance names this process's membership (random per start): the copy
// side of a replication session checks that its credential was signed for
// it.
func (n *Node) Instance() string { return n.instance }

// DeriveReplicationKey is the replication key of the cluster name whose
// token is token (what every node of it derives at Join).
func DeriveReplicationKey(token, clusterName string) []byte {
	return deriveKeys(token, clusterName).replication
}
