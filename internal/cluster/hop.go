package cluster

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/time/rate"
)

// Forwarded opens (docs/cluster.md, "Refusals"): a node that serves a
// client's export through the volume's primary opens it there under the
// client's name followed by a hop mark, /hop1.<unix seconds>.<signature>,
// signed with the cluster's hop key over the name and the time. The primary
// recognizes the mark (nbd.Config.Forwarded), opens the client's name, and
// answers a refusal at once: the forwarding node holds it from its client's
// open, so that a refusal takes as long on every node. Only the cluster's
// nodes hold the key, so a client cannot mark a name itself and time the
// primary's checks without the hold; a mark is good for hopSkew either side
// of the primary's clock.

// hopPrefix starts a hop mark; the version is part of it.
const hopPrefix = "hop1."

// hopSkew is how far a hop's time may be from the primary's clock.
const hopSkew = 30 * time.Second

// SignHop returns export, the name a client opened on this node, as this
// node opens it on the volume's primary for that client.
func (n *Node) SignHop(export string) string { return n.keys.signHop(export, time.Now()) }

// OpenHop returns the client's name of an export that another node of the
// cluster opens for its client (SignHop), and true; false for any other
// name: unmarked, marked by another cluster, changed, or out of time. A
// node's mark out of time (the nodes' clocks apart by more than hopSkew:
// every open forwarded to this node is refused) is logged, at most once a
// second; nothing of the name is.
func (n *Node) OpenHop(name string) (export string, ok bool) {
	export, err := n.keys.openHop(name, time.Now())
	if errors.Is(err, errHopTime) {
		hopLog.Do(func() {
			n.log.Warn("refusing an open another node forwarded: are the nodes' clocks synchronized?", "err", err)
		})
	}
	return export, err == nil
}

// errNotHop: the name bears no mark of this cluster's nodes.
var errNotHop = errors.New("not a hop of this cluster")

// errHopTime: a node's mark, signed too far from this node's clock.
var errHopTime = errors.New("hop signed out of time")

// hopLog paces the warnings of marks out of time.
var hopLog = rate.Sometimes{Interval: time.Second}

func (k nodeKeys) signHop(export string, now time.Time) string {
	at := strconv.FormatInt(now.Unix(), 10)
	return export + "/" + hopPrefix + at + "." + base64.RawURLEncoding.EncodeToString(k.hopSum(export, at))
}

func (k nodeKeys) openHop(name string, now time.Time) (string, error) {
	i := strings.LastIndexByte(name, '/')
	if i < 0 || len(k.hop) == 0 {
		return "", errNotHop
	}
	export, mark := name[:i], name[i+1:]
	rest, ok := strings.CutPrefix(mark, hopPrefix)
	if !ok {
		return "", errNotHop
	}
	at, sig, ok := strings.Cut(rest, ".")
	if !ok {
		return "", errNotHop
	}
	sum, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || !hmac.Equal(sum, k.hopSum(export, at)) {
		return "", errNotHop
	}
	unix, err := strconv.ParseInt(at, 10, 64)
	if err != nil {
		return "", errNotHop
	}
	if d := now.Sub(time.Unix(unix, 0)); d > hopSkew || d < -hopSkew {
		return "", fmt.Errorf("%w: %v from this node's clock, more than %v", errHopTime, d, hopSkew)
	}
	return export, nil
}

func (k nodeKeys) hopSum(export, at string) []byte {
	m := hmac.New(sha256.New, k.hop)
	for _, f := range []string{"quiver nbd hop v1", export, at} {
		m.Write([]byte(f))
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}
