package apiserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/auth"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/storage"
)

// fakeCluster is one node's view of a cluster in which every volume is
// placed with two copies and the primary the test sets (an in-memory
// twin of etcd's records, for the hop's tests).
type fakeCluster struct {
	name  string
	mu    sync.Mutex
	prim  map[string]string // volume -> primary
	addrs map[string]string // node -> API address ("": down)
	// listed: Placements lists the volumes of prim (else none, as the
	// hop's tests want of an admin's list).
	listed bool
	// deleting: the volumes whose placement is being deleted.
	deleting map[string]bool
	// copies: the copies of a volume as etcd records them (else its
	// primary's, in sync).
	copies map[string][]cluster.CopyInfo
	// deleted: the volumes DeleteVolume was asked to delete.
	deleted []string
	// space: the pool space each node reports (total, free) and the
	// copies on it, as etcd's alive/ and volumes/ keys give them.
	space map[string]cluster.NodeInfo
}

var _ Cluster = (*fakeCluster)(nil)

func (f *fakeCluster) Name() string        { return f.name }
func (f *fakeCluster) ClusterName() string { return "the-cluster" }
func (f *fakeCluster) Nodes(context.Context) ([]cluster.NodeInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []cluster.NodeInfo
	for n, a := range f.addrs {
		ni := cluster.NodeInfo{Name: n, API: a, Up: a != ""}
		if ni.Up {
			ni.NBD = "nbd." + n + ":10809"
			ni.TotalBytes, ni.FreeBytes = f.space[n].TotalBytes, f.space[n].FreeBytes
		}
		ni.Volumes = f.space[n].Volumes
		out = append(out, ni)
	}
	return out, nil
}
func (f *fakeCluster) CreateCharged(context.Context, api.VolumeSpec, string, func(bool, string) bool, cluster.Charge) (cluster.Placement, bool, error) {
	return cluster.Placement{}, false, cluster.ErrNotSupported
}
func (f *fakeCluster) DeleteVolume(_ context.Context, v string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.deleted = append(f.deleted, v)
	return cluster.ErrNotSupported
}
func (f *fakeCluster) TenantUsage(context.Context, string) (cluster.Usage, error) {
	return cluster.Usage{}, nil
}
func (f *fakeCluster) ChargeSnapshots(context.Context, string, int64, func(cluster.Usage) error) error {
	return nil
}
func (f *fakeCluster) UpdateSpec(context.Context, string, cluster.SpecChange) (api.VolumeSpec, error) {
	return api.VolumeSpec{}, cluster.ErrNotSupported
}
func (f *fakeCluster) Placement(_ context.Context, v string) (cluster.Placement, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.prim[v]
	return f.placement(v, p), ok, nil
}
func (f *fakeCluster) placement(v, primary string) cluster.Placement {
	pl := cluster.Placement{Volume: v, UID: "cluster-uid-of-" + v, Replicas: 2, Primary: primary, Term: 1, Deleting: f.deleting[v],
		Copies: []cluster.CopyInfo{{Node: primary, State: cluster.CopyInSync}},
		Spec:   api.VolumeSpec{Disks: []api.DiskSpec{{Name: "root", Size: 8 * mib}}}}
	if cs, ok := f.copies[v]; ok {
		pl.Copies = slices.Clone(cs)
	}
	if t, _, found := strings.Cut(v, pool.TenantSeparator); found {
		pl.Spec.Tenant = t // the tenant etcd's record carries
	}
	return pl
}
func (f *fakeCluster) Placements(context.Context) (map[string]cluster.Placement, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.listed {
		return nil, nil
	}
	out := map[string]cluster.Placement{}
	for v, p := range f.prim {
		out[v] = f.placement(v, p)
	}
	return out, nil
}
func (f *fakeCluster) Role(_ context.Context, v string) (cluster.Role, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.prim[v]
	if !ok {
		return cluster.Role{}, nil
	}
	return cluster.Role{Placed: true, Replicas: 2, Primary: p, PrimaryAPI: f.addrs[p], Term: 1}, nil
}

// hopNodes starts the API of nodes a and b (one pool each, sharing the hop
// key), with volume "v" in b's pool and b its primary in both views.
// sharedStore gives nodes one token store, as etcd gives a cluster's
// nodes one, and returns it.
func sharedStore(t *testing.T, nodes ...*Server) *auth.Store {
	t.Helper()
	fsys, err := storage.OpenOS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	store, err := auth.Open(fsys, false)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		n.Auth = store
	}
	return store
}

func hopNodes(t *testing.T, key string) (a, b *Server, aURL string, fa, fb *fakeCluster) {
	t.Helper()
	a, _ = newTestAPI(t, "")
	b, pb := newTestAPI(t, "")
	if _, _, err := pb.Create(context.Background(), pool.VolumeSpec{Name: "v", Capacity: 8 * mib, Disks: []pool.DiskSpec{{Name: "root", Size: 8 * mib}}}); err != nil {
		t.Fatal(err)
	}
	sa, sb := httptest.NewServer(a), httptest.NewServer(b)
	t.Cleanup(sa.Close)
	t.Cleanup(sb.Close)
	addrs := map[string]string{"a": strings.TrimPrefix(sa.URL, "http://"), "b": strings.TrimPrefix(sb.URL, "http://")}
	fa = &fakeCluster{name: "a", prim: map[string]string{"v": "b"}, addrs: addrs}
	fb = &fakeCluster{name: "b", prim: map[string]string{"v": "b"}, addrs: map[string]string{"a": addrs["a"], "b": addrs["b"]}}
	a.Cluster, b.Cluster = fa, fb
	a.Peers = &Peers{Node: "a", Key: []byte(key), Scheme: "http", Client: PeerClient(nil)}
	b.Peers = &Peers{Node: "b", Key: []byte(key), Scheme: "http", Client: PeerClient(nil)}
	return a, b, sa.URL, fa, fb
}

func errCode(t *testing.T, body []byte) string {
	t.Helper()
	var e api.ErrorBody
	_ = json.Unmarshal(body, &e)
	return e.Error.Code
}

// TestHopToPrimary: a snapshot asked of node a is carried to the primary b
// and answered as b answers it: created, then the same with its
// Idempotency-Key, then a conflict with another key; an async one answers
// a job that is read and listed through a; b's refusals come back as they
// are.
func TestHopToPrimary(t *testing.T) {
	_, b, aURL, _, _ := hopNodes(t, "the-cluster-key-0123456789")
	c := &apiClient{t: t, base: aURL}
	post := func(path, key string, in any) (int, []byte, http.Header) {
		t.Helper()
		body, _ := json.Marshal(in)
		req, _ := http.NewRequest(http.MethodPost, aURL+path, strings.NewReader(string(body)))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set(api.IdempotencyKeyHeader, key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out json.RawMessage
		_ = json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out, resp.Header
	}
	status, body, h := post("/v1/volumes/v/snapshots", "k1", api.SnapshotSpec{Name: "s1"})
	var s1 api.Snapshot
	if err := json.Unmarshal(body, &s1); err != nil || status != http.StatusCreated || s1.UID == "" {
		t.Fatalf("snapshot through a: %d %s", status, body)
	}
	if h.Get(HeaderServedBy) != "b" {
		t.Errorf("%s: %q, want b", HeaderServedBy, h.Get(HeaderServedBy))
	}
	if v, _ := b.pool.Volume("v"); len(v.Snapshots()) != 1 {
		t.Fatalf("b's volume has %d snapshots, want 1", len(v.Snapshots()))
	}
	status, body, _ = post("/v1/volumes/v/snapshots", "k1", api.SnapshotSpec{Name: "s1"})
	var again api.Snapshot
	if err := json.Unmarshal(body, &again); err != nil || status != http.StatusOK || again.UID != s1.UID {
		t.Fatalf("the retry with its key: %d %s, want 200 and UID %s", status, body, s1.UID)
	}
	if status, body, _ = post("/v1/volumes/v/snapshots", "k2", api.SnapshotSpec{Name: "s1"}); status != http.StatusConflict || errCode(t, body) != api.CodeConflict {
		t.Fatalf("another key: %d %s, want 409 %s", status, body, api.CodeConflict)
	}
	status, body, _ = post("/v1/volumes/v/snapshots?async=true", "", api.SnapshotSpec{Name: "s2"})
	var j api.Job
	if err := json.Unmarshal(body, &j); err != nil || status != http.StatusAccepted || j.ID == "" {
		t.Fatalf("async snapshot through a: %d %s", status, body)
	}
	if _, err := b.jobs.Get(j.ID); err != nil {
		t.Fatalf("the job is not b's: %v", err)
	}
	if status, body := c.do("GET", "/v1/jobs/"+j.ID, nil); status != http.StatusOK {
		t.Fatalf("the job read through a: %d %s", status, body)
	}
	if status, body := c.do("GET", "/v1/volumes/v/snapshots/nope", nil); status != http.StatusNotFound || errCode(t, body) != api.CodeNotFound {
		t.Fatalf("a missing snapshot through a: %d %s", status, body)
	}
	if status, body := c.do("POST", "/v1/volumes/v/rollback", api.RollbackSpec{Snapshot: "nope"}); status != http.StatusNotFound {
		t.Fatalf("rollback to a missing snapshot through a: %d %s", status, body)
	}
}

// TestHopPrimaryMoved: the primary changes while a request is carried. The
// node it reaches, no longer the primary, refuses it with 409 NotPrimary
// naming the new one and never carries it again (no double operation);
// the caller gets that answer unchanged, and nothing is made. A primary
// that is down, or does not answer, is 503 Unavailable.
func TestHopPrimaryMoved(t *testing.T) {
	_, b, aURL, fa, fb := hopNodes(t, "the-cluster-key-0123456789")
	var hits atomic.Int64
	third := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusTeapot)
	}))
	defer third.Close()
	fb.mu.Lock()
	fb.prim["v"], fb.addrs["c"] = "c", strings.TrimPrefix(third.URL, "http://")
	fb.mu.Unlock()
	c := &apiClient{t: t, base: aURL}
	status, body := c.do("POST", "/v1/volumes/v/snapshots", api.SnapshotSpec{Name: "s1"})
	if status != http.StatusConflict || errCode(t, body) != api.CodeNotPrimary || !strings.Contains(string(body), "primary c") {
		t.Fatalf("through a to b, which lost the volume to c: %d %s, want 409 %s naming c", status, body, api.CodeNotPrimary)
	}
	if hits.Load() != 0 {
		t.Fatalf("the hop was carried again, to c (%d requests)", hits.Load())
	}
	if v, _ := b.pool.Volume("v"); len(v.Snapshots()) != 0 {
		t.Fatalf("b made %d snapshots", len(v.Snapshots()))
	}

	fa.mu.Lock()
	fa.addrs["b"] = ""
	fa.mu.Unlock()
	if status, body := c.do("POST", "/v1/volumes/v/snapshots", api.SnapshotSpec{Name: "s1"}); status != http.StatusServiceUnavailable ||
		errCode(t, body) != api.CodeUnavailable {
		t.Fatalf("primary down: %d %s, want 503 %s", status, body, api.CodeUnavailable)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	fa.mu.Lock()
	fa.addrs["b"] = dead
	fa.mu.Unlock()
	if status, body := c.do("POST", "/v1/volumes/v/snapshots", api.SnapshotSpec{Name: "s1"}); status != http.StatusServiceUnavailable ||
		!strings.Contains(string(body), "did not answer") {
		t.Fatalf("primary not answering: %d %s, want 503 saying so", status, body)
	}
}

// TestHopSignature: only a node holding the cluster's key can claim a
// caller: a hop signed with another key, a hop whose body was changed, or
// one with no signature is 401, and nothing is made.
func TestHopSignature(t *testing.T) {
	_, b, _, _, _ := hopNodes(t, "the-cluster-key-0123456789")
	sb := httptest.NewServer(b)
	defer sb.Close()
	other := &Peers{Node: "x", Key: []byte("another-cluster-key-012345"), Scheme: "http"}
	good := &Peers{Node: "a", Key: []byte("the-cluster-key-0123456789"), Scheme: "http"}
	claim := `eyJyb2xlIjoiYWRtaW4iLCJieSI6ImEiLCJhdCI6MH0` // any: the signature is checked first
	for name, tc := range map[string]struct {
		sig  string
		body string
	}{
		"another key":  {hexSig(other, "POST", "/v1/volumes/v/snapshots", claim, `{"name":"s1"}`), `{"name":"s1"}`},
		"changed body": {hexSig(good, "POST", "/v1/volumes/v/snapshots", claim, `{"name":"s1"}`), `{"name":"s2"}`},
		"no signature": {"", `{"name":"s1"}`},
	} {
		req, _ := http.NewRequest(http.MethodPost, sb.URL+"/v1/volumes/v/snapshots", strings.NewReader(tc.body))
		req.Header.Set(headerHopPrincipal, claim)
		if tc.sig != "" {
			req.Header.Set(headerHopSignature, tc.sig)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", name, resp.StatusCode)
		}
	}
	if v, _ := b.pool.Volume("v"); len(v.Snapshots()) != 0 {
		t.Fatalf("a refused hop made %d snapshots", len(v.Snapshots()))
	}
}

func hexSig(p *Peers, method, uri, claim, body string) string {
	return hex.EncodeToString(p.sign(method, uri, claim, []byte(body)))
}

// TestHopCarriesTheCaller: a hop acts for its caller, never for the node.
// A tenant's snapshot through a is served by b in the tenant's scope (its
// own volume by its own name: made; an untenanted one: not found), and b
// refuses a hop for a token revoked meanwhile, or one claiming more than
// the token's role.
func TestHopCarriesTheCaller(t *testing.T) {
	const key = "the-cluster-key-0123456789"
	a, b, aURL, _, fb := hopNodes(t, key)
	store := sharedStore(t, a, b)
	tok, secret, err := store.Create("t", auth.RoleTenant, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.pool.Create(context.Background(), pool.VolumeSpec{Name: "t--w", Tenant: "t", Capacity: 8 * mib,
		Disks: []pool.DiskSpec{{Name: "root", Size: 8 * mib}}}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*fakeCluster{a.Cluster.(*fakeCluster), fb} {
		f.mu.Lock()
		f.prim["t--w"] = "b"
		f.mu.Unlock()
	}
	tc := &apiClient{t: t, base: aURL, token: secret}
	if status, body := tc.do("POST", "/v1/volumes/w/snapshots", api.SnapshotSpec{Name: "s1"}); status != http.StatusCreated {
		t.Fatalf("the tenant's snapshot of its volume through a: %d %s", status, body)
	}
	if status, body := tc.do("POST", "/v1/volumes/v/snapshots", api.SnapshotSpec{Name: "s1"}); status != http.StatusNotFound {
		t.Fatalf("the tenant's snapshot of a volume not its own through a: %d %s, want 404", status, body)
	}
	if v, _ := b.pool.Volume("v"); len(v.Snapshots()) != 0 {
		t.Fatal("the tenant's hop made a snapshot of a volume not its own")
	}

	sb := httptest.NewServer(b)
	defer sb.Close()
	peer := &Peers{Node: "a", Key: []byte(key)}
	hop := func(c hopClaim) int {
		t.Helper()
		c.At = time.Now().Unix()
		raw, _ := json.Marshal(c)
		enc := base64.RawURLEncoding.EncodeToString(raw)
		body := `{"name":"s9"}`
		req, _ := http.NewRequest(http.MethodPost, sb.URL+"/v1/volumes/t--w/snapshots", strings.NewReader(body))
		req.Header.Set(headerHopPrincipal, enc)
		req.Header.Set(headerHopSignature, hexSig(peer, "POST", "/v1/volumes/t--w/snapshots", enc, body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := hop(hopClaim{TokenID: tok.ID, Tenant: "t", Role: auth.RoleAdmin, By: "a"}); got != http.StatusUnauthorized {
		t.Errorf("a hop claiming admin for a tenant's token: %d, want 401", got)
	}
	if err := store.Revoke(tok.ID); err != nil {
		t.Fatal(err)
	}
	if got := hop(hopClaim{TokenID: tok.ID, Tenant: "t", Role: auth.RoleTenant, By: "a"}); got != http.StatusUnauthorized {
		t.Errorf("a hop for a revoked token: %d, want 401", got)
	}
	if v, _ := b.pool.Volume("t--w"); len(v.Snapshots()) != 1 {
		t.Fatalf("t--w has %d snapshots, want 1 (s1)", len(v.Snapshots()))
	}
}

// TestHopReplayRefused: a hop seen on the network and sent again (the
// same claim, nonce and signature) is refused while its time would still
// be accepted, and so is a hop without a nonce; the first one is served.
func TestHopReplayRefused(t *testing.T) {
	const key = "the-cluster-key-0123456789"
	_, b, _, _, _ := hopNodes(t, key)
	sb := httptest.NewServer(b)
	defer sb.Close()
	good := &Peers{Node: "a", Key: []byte(key), Scheme: "http"}
	send := func(c hopClaim, body string) int {
		t.Helper()
		raw, _ := json.Marshal(c)
		enc := base64.RawURLEncoding.EncodeToString(raw)
		req, _ := http.NewRequest(http.MethodPost, sb.URL+"/v1/volumes/v/snapshots", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(headerHopPrincipal, enc)
		req.Header.Set(headerHopSignature, hexSig(good, http.MethodPost, "/v1/volumes/v/snapshots", enc, body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	c := hopClaim{Role: auth.RoleAdmin, By: "a", At: time.Now().Unix(), Nonce: "n-1"}
	if got := send(c, `{"name":"s1"}`); got != http.StatusCreated {
		t.Fatalf("first hop: %d, want 201", got)
	}
	if got := send(c, `{"name":"s1"}`); got != http.StatusUnauthorized {
		t.Errorf("the same hop again: %d, want 401", got)
	}
	c.Nonce = ""
	if got := send(c, `{"name":"s2"}`); got != http.StatusUnauthorized {
		t.Errorf("a hop without a nonce: %d, want 401", got)
	}
	if v, _ := b.pool.Volume("v"); len(v.Snapshots()) != 1 {
		t.Fatalf("%d snapshots, want the first hop's only", len(v.Snapshots()))
	}
}

// TestHopUntrustedPeer: a primary whose API certificate the node does not
// trust gets no request: the caller's 503 says so (not that the request
// may have been applied), and nothing is made there.
func TestHopUntrustedPeer(t *testing.T) {
	a, b, aURL, fa, _ := hopNodes(t, "the-cluster-key-0123456789")
	sb := httptest.NewTLSServer(b) // its certificate chains to no root of a's
	t.Cleanup(sb.Close)
	fa.mu.Lock()
	fa.addrs["b"] = strings.TrimPrefix(sb.URL, "https://")
	fa.mu.Unlock()
	a.Peers.Scheme, a.Peers.Client = "https", PeerClient(&tls.Config{RootCAs: x509.NewCertPool()})
	c := &apiClient{t: t, base: aURL}
	status, body := c.do("POST", "/v1/volumes/v/snapshots", api.SnapshotSpec{Name: "s1"})
	if status != http.StatusServiceUnavailable || errCode(t, body) != api.CodeUnavailable ||
		!strings.Contains(string(body), "does not trust") || strings.Contains(string(body), "may have been applied") {
		t.Fatalf("a snapshot through a to b, whose certificate a does not trust: %d %s", status, body)
	}
	if v, _ := b.pool.Volume("v"); len(v.Snapshots()) != 0 {
		t.Fatalf("b made %d snapshots", len(v.Snapshots()))
	}
}

// TestTenantOnClusterRefusesUnlisted: a route not listed in
// clusterTenantRoutes answers a tenant's token 403 on a cluster node (a
// route added later is not served to tenants there until it is built for
// them), and is served to an admin, and to a tenant on a single node.
func TestTenantOnClusterRefusesUnlisted(t *testing.T) {
	served := func(http.ResponseWriter, *http.Request) error { return nil }
	tenant := withPrincipal(httptest.NewRequest(http.MethodGet, "/v1/new", nil), auth.Principal{Tenant: "acme"})
	admin := httptest.NewRequest(http.MethodGet, "/v1/new", nil)
	onCluster := &Server{Cluster: &fakeCluster{name: "n1"}}
	if err := onCluster.tenantOnCluster("GET /v1/new", served)(httptest.NewRecorder(), tenant); !errors.Is(err, auth.ErrForbidden) {
		t.Errorf("a tenant on an unlisted route on a cluster: %v, want %v", err, auth.ErrForbidden)
	}
	if err := onCluster.tenantOnCluster("GET /v1/new", served)(httptest.NewRecorder(), withPrincipal(admin, auth.Principal{})); err != nil {
		t.Errorf("an admin on an unlisted route on a cluster: %v", err)
	}
	if err := (&Server{}).tenantOnCluster("GET /v1/new", served)(httptest.NewRecorder(), tenant); err != nil {
		t.Errorf("a tenant on a single node: %v", err)
	}
	if err := onCluster.tenantOnCluster("GET /v1/attachments", served)(httptest.NewRecorder(), tenant); err != nil {
		t.Errorf("a tenant on GET /v1/attachments on a cluster: %v", err)
	}
}
