package apiserver

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/auth"
	"github.com/quiverstorage/quiver/internal/job"
	"github.com/quiverstorage/quiver/internal/pool"
)

// Who a request acts for, and what it may see (docs/security.md, "Tenants").
//
// Every request is authenticated once, in ServeHTTP, into an auth.Principal
// kept in its context; each route names the auth.Action it needs (routes);
// every volume a handler reaches goes through s.volume or s.poolName, which
// map the caller's names to the pool's and refuse, as not found, a volume of
// another tenant (read from its manifest, not from its name).

type ctxKey int

const (
	principalKey ctxKey = iota
	connKey
)

func principalOf(r *http.Request) auth.Principal {
	if p, ok := r.Context().Value(principalKey).(auth.Principal); ok {
		return p
	}
	return auth.Principal{} // no role: allowed nothing
}

func withPrincipal(r *http.Request, p auth.Principal) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), principalKey, p))
}

// authenticate returns who r acts for. The --token-file token is an admin;
// a stored token (auth.Store) acts for its tenant and role, and so does a
// verified client certificate mapped to a certificate token (certauth.go);
// a request without a credential is the anonymous admin only on a node
// that requires none.
func (s *Server) authenticate(r *http.Request) (auth.Principal, error) {
	b, err := s.bearerOf(r)
	if err != nil {
		return auth.Principal{}, err
	}
	if cert, ok := s.certificateOf(r); ok {
		return s.withCertificate(r, cert, b)
	}
	if b.ok {
		return b.p, nil
	}
	if !s.requireToken() {
		return auth.Anonymous, nil
	}
	return auth.Principal{}, errUnauthorized
}

func (s *Server) requireToken() bool { return s.token != "" || s.RequireToken }

// authorize wraps h with the check that the caller's role allows a.
func (s *Server) authorize(a auth.Action, h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		if err := principalOf(r).Check(a); err != nil {
			return err
		}
		return h(w, r)
	}
}

// clusterTenantRoutes are the routes a tenant's token is served on a
// cluster node (docs/security.md, "Tenants on a cluster"): the volume's
// tenant is read from its placement in etcd, and quotas are counted there.
// Every other route answers a tenant 403 on a cluster node: it would read
// or count one node's pool only.
var clusterTenantRoutes = map[string]bool{
	"GET /v1/version": true,
	// The tenant's own counts, quota and use (getPool), and its snapshots
	// across its volumes (findSnapshots): from its placements in etcd.
	"GET /v1/pool":             true,
	"GET /v1/snapshots":        true,
	"GET /v1/whoami":           true,
	"GET /v1/volumes":          true,
	"POST /v1/volumes":         true,
	"GET /v1/volumes/{volume}": true,
	// Where the volume is served: its placement and the nodes, in etcd.
	"GET /v1/volumes/{volume}/primary": true,
	"DELETE /v1/volumes/{volume}":      true,
	// Capacity, labels and QoS: counted in etcd with the volume's charge
	// (updateClusterVolume). Disks live within the capacity, which is what
	// counts; both run on the primary, on every copy.
	"PATCH /v1/volumes/{volume}":               true,
	"POST /v1/volumes/{volume}/disks":          true,
	"PATCH /v1/volumes/{volume}/disks/{disk}":  true,
	"DELETE /v1/volumes/{volume}/disks/{disk}": true,
	// Every attachment of the tenant's volumes, from their primaries
	// (findClusterAttachments).
	"GET /v1/attachments":                               true,
	"GET /v1/volumes/{volume}/attachments":              true,
	"POST /v1/volumes/{volume}/attachments":             true,
	"GET /v1/volumes/{volume}/attachments/{id}":         true,
	"DELETE /v1/volumes/{volume}/attachments/{id}":      true,
	"POST /v1/volumes/{volume}/attachments/{id}/writer": true,
	// Snapshots, rollback and clones run on the volume's primary (any node
	// carries them there), and a new snapshot or clone is counted in etcd.
	"GET /v1/volumes/{volume}/snapshots":                      true,
	"POST /v1/volumes/{volume}/snapshots":                     true,
	"GET /v1/volumes/{volume}/snapshots/{snapshot}":           true,
	"DELETE /v1/volumes/{volume}/snapshots/{snapshot}":        true,
	"GET /v1/volumes/{volume}/snapshots/{snapshot}/changes":   true,
	"GET /v1/volumes/{volume}/snapshots/{snapshot}/allocated": true,
	"POST /v1/volumes/{volume}/rollback":                      true,
	"POST /v1/clones":                                         true,
	// A node's own jobs, each seen by the tenant that started it.
	"GET /v1/jobs":         true,
	"GET /v1/jobs/{id}":    true,
	"DELETE /v1/jobs/{id}": true,
}

// tenantOnCluster refuses a tenant's token on a cluster node for a route
// that is not built for tenants there.
func (s *Server) tenantOnCluster(pattern string, h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	if clusterTenantRoutes[pattern] {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) error {
		if s.Cluster != nil && principalOf(r).Tenant != "" {
			return fmt.Errorf("%s: a tenant's token is not served this route on a cluster node yet (docs/security.md, "+
				"\"Tenants on a cluster\"): %w", pattern, auth.ErrForbidden)
		}
		return h(w, r)
	}
}

// poolName returns the pool's name of the volume the caller calls name.
func poolName(p auth.Principal, name string) (string, error) {
	if p.Tenant == "" {
		return name, nil
	}
	if err := pool.ValidateName("name", name); err != nil {
		return "", err
	}
	if max := pool.MaxTenantVolumeName(p.Tenant); len(name) > max {
		return "", &pool.FieldError{Field: "name", Value: name,
			Rule: fmt.Sprintf("a volume name of tenant %q has at most %d characters", p.Tenant, max)}
	}
	return pool.TenantVolumeName(p.Tenant, name), nil
}

// volumeOf looks up the caller's volume name: a volume of another tenant
// is not found, with the same message as an absent one.
func (s *Server) volumeOf(r *http.Request, name string) (*pool.Volume, error) {
	p := principalOf(r)
	notFound := fmt.Errorf("volume %q: %w", name, pool.ErrVolumeNotFound)
	pn, err := poolName(p, name)
	if err != nil {
		return nil, err // a name no volume can have: bad input, which says nothing of others
	}
	v, err := s.pool.Volume(pn)
	if err != nil {
		if p.Tenant != "" {
			return nil, notFound
		}
		return nil, err
	}
	if !p.Sees(v.Tenant()) {
		return nil, notFound
	}
	return v, nil
}

// view translates the pool's names into the caller's.
type view struct{ tenant string }

func viewOf(r *http.Request) view { return view{tenant: principalOf(r).Tenant} }

func (v view) name(n string) string {
	if l, ok := pool.TenantLocalName(v.tenant, n); ok {
		return l
	}
	return n
}

func (v view) volume(x api.Volume) api.Volume {
	x.Name = v.name(x.Name)
	if x.Source != nil {
		s := *x.Source
		s.Volume = v.name(s.Volume)
		x.Source = &s
	}
	return x
}

func (v view) snapshot(x api.Snapshot) api.Snapshot { x.Volume = v.name(x.Volume); return x }

func (v view) attachment(x api.Attachment) api.Attachment { x.Volume = v.name(x.Volume); return x }

func (v view) job(x api.Job) api.Job {
	if v.tenant != "" {
		x.Target = strings.ReplaceAll(x.Target, v.tenant+pool.TenantSeparator, "")
	}
	return x
}

// visible returns the volumes matching match in the caller's scope.
func (s *Server) visible(r *http.Request, match func(map[string]string) bool) []pool.VolumeInfo {
	p := principalOf(r)
	var out []pool.VolumeInfo
	for _, v := range s.pool.List(match) {
		if p.Sees(v.Tenant) {
			out = append(out, v)
		}
	}
	return out
}

// Jobs are seen by the tenant that started them (and by node-wide
// principals).
func (s *Server) ownJob(r *http.Request, id string) bool {
	p := principalOf(r)
	if p.Tenant == "" {
		return true
	}
	t, ok := s.jobTenants.Load(id)
	return ok && t.(string) == p.Tenant
}

// forgetJobs drops the tenants of jobs the manager no longer lists.
func (s *Server) forgetJobs(listed []job.Status) {
	ids := make(map[string]bool, len(listed))
	for _, j := range listed {
		ids[j.ID] = true
	}
	s.jobTenants.Range(func(k, _ any) bool {
		if id := k.(string); !ids[id] {
			if _, err := s.jobs.Get(id); err != nil { // not one started since List
				s.jobTenants.Delete(k)
			}
		}
		return true
	})
}

// Revocation of API sessions: every connection that carried a stored token
// (as a secret or as a client certificate mapped to it) is closed when the
// token is revoked (auth.Store.Done), within the time a
// goroutine takes to wake, so an idle keep-alive connection or a long
// request of the token ends too, not only its next request.

type connTrack struct {
	nc     net.Conn
	closed chan struct{}
	mu     sync.Mutex
	seen   map[string]bool
}

// ConnContext is for http.Server.ConnContext: it tracks the connection.
func (s *Server) ConnContext(ctx context.Context, c net.Conn) context.Context {
	t := &connTrack{nc: c, closed: make(chan struct{})}
	s.conns.Store(c, t)
	return context.WithValue(ctx, connKey, t)
}

// ConnState is for http.Server.ConnState: it forgets closed connections.
func (s *Server) ConnState(c net.Conn, st http.ConnState) {
	if st != http.StateClosed && st != http.StateHijacked {
		return
	}
	if t, ok := s.conns.LoadAndDelete(c); ok {
		close(t.(*connTrack).closed)
	}
}

// watchRevocation closes r's connection when p's token is revoked.
func (s *Server) watchRevocation(r *http.Request, p auth.Principal) {
	if p.TokenID == "" || s.Auth == nil {
		return
	}
	t, ok := r.Context().Value(connKey).(*connTrack)
	if !ok {
		return
	}
	t.mu.Lock()
	first := !t.seen[p.TokenID]
	if t.seen == nil {
		t.seen = map[string]bool{}
	}
	t.seen[p.TokenID] = true
	t.mu.Unlock()
	if !first {
		return
	}
	done := s.Auth.Done(p.TokenID)
	go func() {
		select {
		case <-done:
			s.log.Info("token revoked: closing its API connection", "token", p.TokenID)
			_ = t.nc.Close()
		case <-t.closed:
		}
	}()
}
