package server

import (
	"context"
	"fmt"
	"strings"

	"github.com/quiverstorage/quiver/internal/auth"
	"github.com/quiverstorage/quiver/internal/metrics"
	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/pool"
)

// tenantExports serves NBD exports opened with an API token in the export
// name (docs/security.md, "Tenants"):
//
//	<volume>/<disk>/<API token>             read-write, as an implicit attachment
//	<volume>@<snapshot>/<disk>/<API token>  read-only
//
// The token's role must allow attaching (admin, tenant, attach); <volume>
// is the caller's name for it (its tenant's name, without the prefix), and
// the volume's tenant, read from its manifest, must be the token's. Every
// failure gets the same answer as a wrong attachment token, so names cannot
// be probed. The connection ends when the token is revoked.
//
// A client certificate verified by mutual TLS and mapped to a certificate
// token (auth.Store.CreateForCertificate) stands for that token when the
// export name carries none: <volume>/<disk> is then opened exactly as
// <volume>/<disk>/<API token> would be, through openAs. A mapped
// certificate never falls back to the tokenless opens of a loopback node.
//
// An attachment token's export may name the volume by its tenant's name as
// well as by the pool's: when <volume> has no attachment with that token, the
// volume <tenant>--<volume> of each tenant is tried (the token, 256 random
// bits, matches one attachment of one volume at most). Every other export
// name goes to next unchanged.
//
// On a cluster node (cluster set) neither is served: the name resolved here
// would bypass the placement, forwarding and replication, which follow the
// pool's name. A tenant's API token opens nothing over NBD there, and an
// attachment token opens the export of the pool's name, as the attach
// answer's URIs give it (docs/security.md, "Tenants on a cluster").
type tenantExports struct {
	cluster bool
	next    nbd.Exports
	pool    *pool.Pool
	store   *auth.Store
	direct  nbd.PoolExports // opens the resolved name, tokenless (the token was checked here)
}

var _ nbd.Exports = tenantExports{}

func newTenantExports(next nbd.Exports, p *pool.Pool, m *metrics.Metrics, store *auth.Store) tenantExports {
	return tenantExports{next: next, pool: p, store: store, direct: nbd.PoolExports{Pool: p, Metrics: m}}
}

// errNoAccess is the answer to every refused open: it says nothing about
// which part was wrong.
var errNoAccess = fmt.Errorf("no such export, or its token is missing or wrong: %w", pool.ErrUnauthorized)

// List implements nbd.Exports. NBD_OPT_LIST carries no credential of its
// own: a client whose verified certificate is mapped to a certificate token
// gets the exports that token may open, under the names it opens them by
// (a tenant's own volume names); any other client is answered as before:
// everything on a tokenless node, refused otherwise.
func (e tenantExports) List(ctx context.Context) ([]nbd.ExportInfo, error) {
	cert := nbd.PeerCertificate(ctx)
	if cert == nil {
		return e.next.List(ctx)
	}
	p, err := e.store.AuthenticateCertificate(cert.Raw)
	if err != nil {
		return e.next.List(ctx)
	}
	if !p.Allows(auth.ActAttach) || (e.cluster && p.Tenant != "") {
		return nil, errNoAccess
	}
	all, err := e.direct.List(ctx)
	if err != nil {
		return nil, err
	}
	var out []nbd.ExportInfo
	for _, x := range all {
		ref, err := nbd.ParseExportName(x.Name)
		if err != nil {
			continue
		}
		v, err := e.pool.Volume(ref.Volume)
		if err != nil || !p.Sees(v.Tenant()) {
			continue
		}
		local, ok := pool.TenantLocalName(p.Tenant, ref.Volume)
		if !ok {
			continue
		}
		out = append(out, nbd.ExportInfo{Name: nbd.ExportName(local, ref.Snapshot, ref.Disk),
			Description: strings.Replace(x.Description, ref.Volume, local, 1)})
	}
	return out, nil
}

// Open implements nbd.Exports.
func (e tenantExports) Open(ctx context.Context, name, peer string) (nbd.Export, error) {
	ref, err := nbd.ParseExportName(name)
	if err == nil && ref.Token == "" {
		// A client certificate with a certificate token stands for
		// that token (mutual TLS verified it against the client CAs).
		if cert := nbd.PeerCertificate(ctx); cert != nil {
			if p, err := e.store.AuthenticateCertificate(cert.Raw); err == nil {
				return e.openAs(ctx, p, ref, peer)
			}
		}
	}
	if err != nil || ref.Token == "" {
		return e.next.Open(ctx, name, peer)
	}
	if !auth.IsSecret(ref.Token) {
		if e.cluster {
			return e.next.Open(ctx, name, peer)
		}
		return e.next.Open(ctx, e.attachmentExport(ref, name), peer)
	}
	p, err := e.store.Authenticate(ref.Token)
	if err != nil {
		return nbd.Export{}, errNoAccess
	}
	return e.openAs(ctx, p, ref, peer)
}

// openAs opens ref for p, a token's principal (from the export name's
// API token or from a client certificate's certificate token): the one
// authorization of NBD opens by credential.
func (e tenantExports) openAs(ctx context.Context, p auth.Principal, ref nbd.ExportRef, peer string) (nbd.Export, error) {
	// On a cluster a tenant's API token opens no export (docs/security.md,
	// "Tenants on a cluster").
	if !p.Allows(auth.ActAttach) || (e.cluster && p.Tenant != "") {
		return nbd.Export{}, errNoAccess
	}
	local := ref.Volume
	if p.Tenant != "" {
		if err := pool.ValidateName("volume", local); err != nil || len(local) > pool.MaxTenantVolumeName(p.Tenant) {
			return nbd.Export{}, errNoAccess
		}
	}
	vol := pool.TenantVolumeName(p.Tenant, local)
	v, err := e.pool.Volume(vol)
	if err != nil || !p.Sees(v.Tenant()) {
		return nbd.Export{}, errNoAccess
	}
	x, err := e.direct.Open(ctx, nbd.ExportName(vol, ref.Snapshot, ref.Disk), peer)
	if err != nil {
		return x, err
	}
	revoked := e.store.Done(p.TokenID)
	if x.Revoked == nil {
		x.Revoked = revoked
		return x, nil
	}
	// Either ends the connection: the token's revocation or the end of
	// the implicit attachment (which comes when the connection closes).
	att, both := x.Revoked, make(chan struct{})
	go func() {
		defer close(both)
		select {
		case <-att:
		case <-revoked:
		}
	}()
	x.Revoked = both
	return x, nil
}

// attachmentExport returns the export name that reaches the attachment of
// ref's token: name itself, or the name with the pool's name of a tenant's
// volume.
func (e tenantExports) attachmentExport(ref nbd.ExportRef, name string) string {
	if hasToken(e.pool, ref.Volume, ref.Token) {
		return name
	}
	for _, t := range e.store.Tenants() {
		vol := pool.TenantVolumeName(t.Name, ref.Volume)
		if hasToken(e.pool, vol, ref.Token) {
			return nbd.ExportName(vol, ref.Snapshot, ref.Disk) + "/" + ref.Token
		}
	}
	return name
}

func hasToken(p *pool.Pool, volume, token string) bool {
	if pool.ValidateName("volume", volume) != nil {
		return false
	}
	v, err := p.Volume(volume)
	if err != nil {
		return false
	}
	_, err = v.AttachmentByToken(token)
	return err == nil
}
