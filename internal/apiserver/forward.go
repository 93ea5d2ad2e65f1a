package apiserver

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/auth"
)

// Any node serves any request (docs/cluster.md, "Any node's API").
//
// A request that must run on a volume's primary (snapshots, rollback, disk
// changes, clones, attachments) and reaches another node is carried by
// that node to the primary's API address from etcd, and the primary's
// answer is returned to the caller unchanged: status, body and error code.
// The caller needs one endpoint, whichever node it is.
//
// The hop acts for the caller, never for the node: it carries the
// principal the receiving node authenticated (token ID, tenant, role), and
// the primary serves it exactly as if the caller had called it, through the
// same authorization, tenancy and quota checks. The hop is signed with an
// HMAC of a key derived from the cluster token (cluster.Config.PeerKey),
// which only the cluster's nodes hold, over the method, the URI, the
// principal, the time and the body: nobody else can claim a principal, and
// a signed hop cannot be bent to another request. A stored token is checked
// again on the primary (still in the store, same tenant and role), so a
// token revoked meanwhile is refused there too.
//
// A hop is carried once: the node it reaches serves it or refuses it (a
// primary that lost the volume meanwhile answers 409 NotPrimary, naming the
// new primary, which the caller sends it again to any node). A request that
// was sent and got no answer is never sent again by the node: it may have
// been applied, and the caller's retry (with the same Idempotency-Key,
// which the hop carries) is what makes it once. An asynchronous answer
// (202 with a job) is remembered, so that the job is read and cancelled
// through the node the caller used.

// Headers of a hop between nodes.
const (
	headerHopPrincipal = "Quiver-Hop-Principal" // base64url(JSON hopClaim)
	headerHopSignature = "Quiver-Hop-Signature" // hex HMAC-SHA256
	// HeaderServedBy names the node that served a request carried to it
	// (set on the answer of a hop).
	HeaderServedBy = "Quiver-Served-By"
)

// hopSkew bounds how old (or how far ahead) a hop's time may be.
const hopSkew = 2 * time.Minute

// Peers carries requests to other nodes of the cluster. Server.Peers is nil
// on a single node (and then a request for another node's primary is
// refused with NotPrimary, as before).
type Peers struct {
	Node   string       // this node's name
	Key    []byte       // the hop key (cluster.Config.PeerKey)
	Client *http.Client // to the peers' API (their TLS roots when Scheme is https)
	Scheme string       // "http" or "https", as this node's API
	// remote maps the IDs of jobs started by a hop to the node that runs
	// them (remoteJob), each kept for remoteJobTTL.
	remote sync.Map

	seenMu sync.Mutex
	seen   map[string]time.Time // nonces of hops served, with when to forget them
	swept  time.Time
}

// remoteJobAt is where a job started by a hop runs, since when.
type remoteJobAt struct {
	node string
	at   time.Time
}

// remoteJobTTL is how long a node remembers where a hop's job runs: longer
// than a finished job stays listed (job.Retention) after any job a client
// still waits for.
const remoteJobTTL = time.Hour

// remember records that job id runs on node, and forgets the jobs
// remembered longer than remoteJobTTL.
func (p *Peers) remember(id, node string) {
	now := time.Now()
	p.remote.Range(func(k, v any) bool {
		if now.Sub(v.(remoteJobAt).at) > remoteJobTTL {
			p.remote.Delete(k)
		}
		return true
	})
	p.remote.Store(id, remoteJobAt{node: node, at: now})
}

// firstSight records a hop's nonce and reports whether it is new. A nonce
// is kept until its hop's time is past hopSkew (after that the hop is
// refused for its age), so a hop seen on the network cannot be sent again
// while it would still be accepted. The set holds the hops of the last few
// minutes, bounded by the request rate the connection limits allow.
func (p *Peers) firstSight(nonce string, at time.Time) bool {
	now := time.Now()
	p.seenMu.Lock()
	defer p.seenMu.Unlock()
	if p.seen == nil {
		p.seen = make(map[string]time.Time)
	}
	if now.Sub(p.swept) > hopSkew {
		for n, t := range p.seen {
			if now.Sub(t) > hopSkew {
				delete(p.seen, n)
			}
		}
		p.swept = now
	}
	if _, dup := p.seen[nonce]; dup {
		return false
	}
	p.seen[nonce] = at.Add(hopSkew) // kept until at + 2*hopSkew at most
	return true
}

// hopClaim is what a hop says about its caller.
type hopClaim struct {
	TokenID string    `json:"tokenID,omitempty"`
	Tenant  string    `json:"tenant,omitempty"`
	Role    auth.Role `json:"role"`
	By      string    `json:"by"`    // the node that authenticated the caller
	At      int64     `json:"at"`    // unix seconds
	Nonce   string    `json:"nonce"` // random, once per hop: a replay of it is refused
}

func (p *Peers) sign(method, uri, claim string, body []byte) []byte {
	m := hmac.New(sha256.New, p.Key)
	sum := sha256.Sum256(body)
	fmt.Fprintf(m, "%s\n%s\n%s\n%x", method, uri, claim, sum)
	return m.Sum(nil)
}

type hopKey struct{}

// isHop says whether r was carried here from another node.
func isHop(r *http.Request) bool { _, ok := r.Context().Value(hopKey{}).(bool); return ok }

// serveHop serves a request another node carried here, and reports whether
// r was one.
func (s *Server) serveHop(w http.ResponseWriter, r *http.Request) bool {
	enc := r.Header.Get(headerHopPrincipal)
	if enc == "" && r.Header.Get(headerHopSignature) == "" {
		return false
	}
	p, err := s.hopPrincipal(w, r, enc)
	if err != nil {
		s.writeError(w, r, err)
		return true
	}
	s.route(w, withPrincipal(r.WithContext(context.WithValue(r.Context(), hopKey{}, true)), p))
	return true
}

// hopPrincipal checks a hop's signature and returns who it acts for.
func (s *Server) hopPrincipal(w http.ResponseWriter, r *http.Request, enc string) (auth.Principal, error) {
	if s.Peers == nil || len(s.Peers.Key) == 0 {
		return auth.Principal{}, fmt.Errorf("a request carried from another node, and this node is not in a cluster: %w", errUnauthorized)
	}
	if err := s.readBody(w, r); err != nil {
		return auth.Principal{}, err
	}
	body, _ := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(body))
	want := s.Peers.sign(r.Method, r.URL.RequestURI(), enc, body)
	got, _ := hex.DecodeString(r.Header.Get(headerHopSignature))
	if !hmac.Equal(got, want) {
		return auth.Principal{}, fmt.Errorf("a request carried from another node with a wrong signature: %w", errUnauthorized)
	}
	raw, err := base64.RawURLEncoding.DecodeString(enc)
	var c hopClaim
	if err == nil {
		err = json.Unmarshal(raw, &c)
	}
	if err != nil {
		return auth.Principal{}, fmt.Errorf("a request carried from another node: its principal: %v: %w", err, errUnauthorized)
	}
	if d := time.Since(time.Unix(c.At, 0)); d > hopSkew || d < -hopSkew {
		return auth.Principal{}, fmt.Errorf("a request carried from node %s %v ago (at most %v; are the clocks set?): %w",
			c.By, d.Round(time.Second), hopSkew, errUnauthorized)
	}
	if c.Nonce == "" || !s.Peers.firstSight(c.Nonce, time.Unix(c.At, 0)) {
		return auth.Principal{}, fmt.Errorf("a request carried from node %s was replayed: %w", c.By, errUnauthorized)
	}
	p := auth.Principal{TokenID: c.TokenID, Tenant: c.Tenant, Role: c.Role}
	if p.TokenID != "" {
		// A stored token: still there, as it was (revoked meanwhile: refused).
		if s.Auth == nil {
			return auth.Principal{}, errUnauthorized
		}
		t, err := s.Auth.Get(p.TokenID)
		if err != nil || t.Tenant != p.Tenant || t.Role != p.Role {
			return auth.Principal{}, errUnauthorized
		}
	}
	return p, nil
}

// forward carries r to node's API at addr and copies its answer to w.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, node, addr string) error {
	body, err := io.ReadAll(r.Body) // read whole by route
	if err != nil {
		return &badRequest{msg: "request body: " + err.Error()}
	}
	resp, out, err := s.hop(r, node, addr, r.Method, r.URL.RequestURI(), body)
	if err != nil {
		return err
	}
	if resp.StatusCode == http.StatusAccepted {
		var j api.Job
		if json.Unmarshal(out, &j) == nil && j.ID != "" {
			s.Peers.remember(j.ID, node)
		}
	}
	for k, vs := range resp.Header {
		if !hopByHop(k) {
			w.Header()[k] = vs
		}
	}
	w.Header().Set(HeaderServedBy, node)
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(out)
	return nil
}

// hop sends method uri with body to node's API at addr, for r's caller
// (its principal, signed; r's headers but its credential), and returns the
// answer with its body read whole.
func (s *Server) hop(r *http.Request, node, addr, method, uri string, body []byte) (*http.Response, []byte, error) {
	what := method + " " + strings.SplitN(uri, "?", 2)[0]
	if addr == "" {
		return nil, nil, fmt.Errorf("%s: it is served by %s, which is down now; send it again once another node has taken over (quiver volume get shows the primary): %w",
			what, node, errUnavailable)
	}
	pr := principalOf(r)
	claim, _ := json.Marshal(hopClaim{TokenID: pr.TokenID, Tenant: pr.Tenant, Role: pr.Role, By: s.Peers.Node,
		At: time.Now().Unix(), Nonce: rand.Text()})
	enc := base64.RawURLEncoding.EncodeToString(claim)
	req, err := http.NewRequestWithContext(r.Context(), method, s.Peers.Scheme+"://"+addr+uri, bytes.NewReader(body))
	if err != nil {
		return nil, nil, fmt.Errorf("%s: carry it to %s at %s: %w", what, node, addr, err)
	}
	for k, vs := range r.Header {
		if !hopByHop(k) && k != "Authorization" {
			req.Header[k] = vs
		}
	}
	req.Header.Set(headerHopPrincipal, enc)
	req.Header.Set(headerHopSignature, hex.EncodeToString(s.Peers.sign(method, uri, enc, body)))
	resp, err := s.Peers.Client.Do(req)
	if err != nil {
		if r.Context().Err() != nil {
			return nil, nil, fmt.Errorf("%s: %w", what, r.Context().Err())
		}
		var cv *tls.CertificateVerificationError
		if errors.As(err, &cv) {
			// The handshake failed: nothing was sent.
			return nil, nil, fmt.Errorf("%s: not carried to %s at %s, whose API certificate this node does not trust (%v); "+
				"nothing was sent: each node's --tls-cert file must carry the CA of the others' certificates after its leaf "+
				"(docs/cluster.md, \"Any node's API\"): %w", what, node, addr, cv, errUnavailable)
		}
		return nil, nil, fmt.Errorf("%s: carried to %s at %s, which did not answer (%v); it may have been applied there: "+
			"send it again to any node (with the same Idempotency-Key for a create): %w", what, node, addr, err, errUnavailable)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, maxForwardedAnswer+1))
	if err == nil && len(out) > maxForwardedAnswer {
		err = fmt.Errorf("more than %d bytes", maxForwardedAnswer)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s: carried to %s at %s, whose answer (%d) broke off (%v); it may have been applied there: "+
			"send it again to any node: %w", what, node, addr, resp.StatusCode, err, errUnavailable)
	}
	return resp, out, nil
}

// maxForwardedAnswer bounds the answer of a hop (a list of snapshots or
// attachments of one volume: far below it).
const maxForwardedAnswer = 64 << 20

func hopByHop(k string) bool {
	switch http.CanonicalHeaderKey(k) {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
		"Content-Length", headerHopPrincipal, headerHopSignature:
		return true
	}
	return false
}

// toPrimary serves r through volume's primary when this node is not it,
// and reports whether it did (its error is the request's). A hop is never
// carried again: the node it reached answers it.
func (s *Server) toPrimary(w http.ResponseWriter, r *http.Request, volume string) (bool, error) {
	if s.Peers == nil || isHop(r) {
		return false, nil
	}
	role, err := s.Cluster.Role(r.Context(), volume)
	if err != nil {
		return true, fmt.Errorf("%w: %w", errUnavailable, err)
	}
	if !role.Placed || role.IsPrimary(s.Cluster.Name()) || role.Primary == "" {
		return false, nil
	}
	return true, s.forward(w, r, role.Primary, role.PrimaryAPI)
}

// remoteJob serves a job route for a job a hop started on another node,
// and reports whether it did.
func (s *Server) remoteJob(h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		if s.Peers == nil || s.Cluster == nil || isHop(r) {
			return h(w, r)
		}
		id := r.PathValue("id")
		v, ok := s.Peers.remote.Load(id)
		if !ok {
			return h(w, r)
		}
		if _, err := s.jobs.Get(id); err == nil {
			return h(w, r) // this node's own (IDs are random: never both)
		}
		node := v.(remoteJobAt).node
		apis, err := s.nodeAPIs(r)
		if err != nil {
			return err
		}
		addr := apis[node]
		if addr == "" {
			return fmt.Errorf("job %q runs on node %s, which is down: %w", id, node, errUnavailable)
		}
		return s.forward(w, r, node, addr)
	}
}

// cloneSource reads the source volume of a clone request from its body
// (read whole by route), leaving the body to be read again.
func cloneSource(r *http.Request) string {
	b, err := io.ReadAll(r.Body)
	r.Body = io.NopCloser(bytes.NewReader(b))
	if err != nil {
		return ""
	}
	var spec api.CloneSpec
	if json.Unmarshal(b, &spec) != nil {
		return "" // the handler answers bad input
	}
	return spec.Source.Volume
}

// cloneOnPrimary carries a clone to its source's primary.
func (s *Server) cloneOnPrimary(h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		if s.Cluster == nil || s.Peers == nil || isHop(r) {
			return h(w, r)
		}
		src := cloneSource(r)
		if src == "" {
			return h(w, r)
		}
		// In the caller's scope: another tenant's source is not found
		// (by the handler, as on a single node), never carried.
		pl, placed, err := s.clusterVolumeOf(r, src)
		if errors.Is(err, errUnavailable) {
			return err
		}
		if err != nil || !placed { // a name no volume has: the handler answers
			return h(w, r)
		}
		if pl.Deleting {
			return refuseDeleting(pl)
		}
		if done, err := s.toPrimary(w, r, pl.Volume); done {
			return err
		}
		return h(w, r)
	}
}

// PeerClient is the HTTP client of a node's hops; tc (nil: plain HTTP)
// holds the roots its peers' API certificates are checked against. It
// follows no redirect: the answer goes back to the caller as it is.
func PeerClient(tc *tls.Config) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = tc
	return &http.Client{Transport: t,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}
