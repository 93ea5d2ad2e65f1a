package apiserver

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"strings"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/auth"
	"github.com/quiverstorage/quiver/internal/pool"
)

// errNoStore answers the token and tenant routes of a server without a
// token store (tests that build the API alone).
var errNoStore = fmt.Errorf("this server keeps no token store: %w", auth.ErrForbidden)

func tokenToAPI(t auth.Token) api.Token {
	return api.Token{ID: t.ID, Tenant: t.Tenant, Role: string(t.Role), Description: t.Description, CreatedAt: t.CreatedAt,
		CertSHA256: t.CertSHA256}
}

func quotaToAPI(q auth.Quota) api.Quota { return api.Quota(q) }

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request) error {
	if s.Auth == nil {
		return errNoStore
	}
	out := api.List[api.Token]{Items: []api.Token{}}
	for _, t := range s.Auth.List() {
		out.Items = append(out.Items, tokenToAPI(t))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) createToken(w http.ResponseWriter, r *http.Request) error {
	if s.Auth == nil {
		return errNoStore
	}
	var spec api.TokenSpec
	if err := decode(r, &spec); err != nil {
		return err
	}
	if spec.Certificate != "" {
		der, err := certificateDER(spec.Certificate)
		if err != nil {
			return err
		}
		t, err := s.Auth.CreateForCertificate(spec.Tenant, auth.Role(spec.Role), spec.Description, der)
		if err != nil {
			return err
		}
		s.log.Info("certificate token created", "token", t.ID, "tenant", t.Tenant, "role", t.Role, "cert_sha256", t.CertSHA256)
		writeJSON(w, http.StatusCreated, tokenToAPI(t))
		return nil
	}
	t, secret, err := s.Auth.Create(spec.Tenant, auth.Role(spec.Role), spec.Description)
	if err != nil {
		return err
	}
	s.log.Info("token created", "token", t.ID, "tenant", t.Tenant, "role", t.Role)
	out := tokenToAPI(t)
	out.Secret = secret
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// certificateDER returns the DER of the one PEM certificate in p.
func certificateDER(p string) ([]byte, error) {
	block, rest := pem.Decode([]byte(p))
	switch {
	case block == nil || block.Type != "CERTIFICATE":
		return nil, fmt.Errorf("certificate: want one PEM CERTIFICATE block: %w", auth.ErrInvalid)
	case len(strings.TrimSpace(string(rest))) != 0:
		return nil, fmt.Errorf("certificate: data after the first PEM block (one certificate, the client's own, not a chain): %w", auth.ErrInvalid)
	}
	if _, err := x509.ParseCertificate(block.Bytes); err != nil {
		return nil, fmt.Errorf("certificate: %v: %w", err, auth.ErrInvalid)
	}
	return block.Bytes, nil
}

func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request) error {
	if s.Auth == nil {
		return errNoStore
	}
	id := r.PathValue("id")
	if err := s.Auth.Revoke(id); err != nil {
		return err
	}
	s.log.Info("token revoked", "token", id)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) listTenants(w http.ResponseWriter, r *http.Request) error {
	if s.Auth == nil {
		return errNoStore
	}
	out := api.List[api.Tenant]{Items: []api.Tenant{}}
	for _, t := range s.Auth.Tenants() {
		used, err := s.tenantUse(r, t.Name)
		if err != nil {
			return err
		}
		out.Items = append(out.Items, api.Tenant{Name: t.Name, Quota: quotaToAPI(t.Quota), Used: quotaToAPI(used)})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) setTenant(w http.ResponseWriter, r *http.Request) error {
	if s.Auth == nil {
		return errNoStore
	}
	var spec api.TenantSpec
	if err := decode(r, &spec); err != nil {
		return err
	}
	t, err := s.Auth.SetQuota(r.PathValue("tenant"), auth.Quota(spec.Quota))
	if err != nil {
		return err
	}
	used, err := s.tenantUse(r, t.Name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, api.Tenant{Name: t.Name, Quota: quotaToAPI(t.Quota), Used: quotaToAPI(used)})
	return nil
}

// tenantUse is what tenant's volumes count against its quotas: on a
// cluster node, the cluster-wide use kept in etcd (snapshots are not
// counted there), else this node's pool.
func (s *Server) tenantUse(r *http.Request, tenant string) (auth.Quota, error) {
	if s.Cluster == nil {
		return s.usage(tenant), nil
	}
	u, err := s.Cluster.TenantUsage(r.Context(), tenant)
	if err != nil {
		return auth.Quota{}, fmt.Errorf("%w: %w", errUnavailable, err)
	}
	return usageToQuota(u), nil
}

func (s *Server) whoami(w http.ResponseWriter, r *http.Request) error {
	p := principalOf(r)
	writeJSON(w, http.StatusOK, api.WhoAmI{TokenID: p.TokenID, Tenant: p.Tenant, Role: string(p.Role),
		MaxVolumeName: pool.MaxTenantVolumeName(p.Tenant)})
	return nil
}
