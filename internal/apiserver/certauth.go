package apiserver

import (
	"crypto/subtle"
	"fmt"
	"net/http"
	"strings"

	"github.com/quiverstorage/quiver/internal/auth"
)

// Credentials of a request (docs/security.md, "Client certificates").
//
// A request may carry a bearer token (the --token-file token, or a stored
// token's secret) and, over HTTPS with client certificates asked for
// (--api-client-cert), a client certificate that the TLS handshake verified
// against the client CAs. A verified certificate mapped to a certificate
// token (auth.Store.CreateForCertificate) acts for exactly that token, as
// it does over NBD; a certificate mapped to no token is no credential at
// all. When a request carries both a mapped certificate and a bearer token,
// the two must agree, that is act for the same role of the same tenant;
// otherwise (or when the bearer token is not one the node knows) it is
// refused with 401, so that one of them cannot widen or change what the
// other may do. A mapped certificate never falls back to the tokenless
// admin of a loopback node.

// bearer is what a request's Authorization header says.
type bearer struct {
	sent bool           // the request has "Authorization: Bearer ..."
	ok   bool           // and the token is the --token-file token or a stored one
	p    auth.Principal // who it acts for, when ok
}

// bearerOf authenticates r's bearer token. A token with the shape of a
// stored secret that is not stored is refused here (errUnauthorized); any
// other unknown token is left to the caller, as not ok.
func (s *Server) bearerOf(r *http.Request) (bearer, error) {
	got, sent := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	b := bearer{sent: sent}
	switch {
	case !sent:
	case s.token != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.token)) == 1:
		b.ok, b.p = true, auth.Principal{Role: auth.RoleAdmin}
	case s.Auth != nil && auth.IsSecret(got):
		p, err := s.Auth.Authenticate(got)
		if err != nil {
			return b, errUnauthorized
		}
		b.ok, b.p = true, p
	}
	return b, nil
}

// certificateOf returns the principal of r's client certificate: one that
// the TLS handshake verified against the client CAs and that is mapped to a
// certificate token. ok is false for a request without one.
func (s *Server) certificateOf(r *http.Request) (p auth.Principal, ok bool) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 || s.Auth == nil {
		return auth.Principal{}, false
	}
	p, err := s.Auth.AuthenticateCertificate(r.TLS.VerifiedChains[0][0].Raw)
	if err != nil {
		return auth.Principal{}, false
	}
	return p, true
}

// withCertificate returns who a request with a mapped certificate (cert)
// and bearer b acts for: the certificate's token, when b is absent or acts
// for the same role of the same tenant. Then b's token, if it is a stored
// one, also ends the connection when it is revoked.
func (s *Server) withCertificate(r *http.Request, cert auth.Principal, b bearer) (auth.Principal, error) {
	if !b.sent {
		return cert, nil
	}
	if !b.ok || b.p.Role != cert.Role || b.p.Tenant != cert.Tenant {
		return auth.Principal{}, fmt.Errorf("the client certificate acts for a %s; the bearer token is another credential "+
			"(send one of them, or both of the same role and tenant): %w", scope(cert), errUnauthorized)
	}
	s.watchRevocation(r, b.p)
	return cert, nil
}

// scope names what p may act on, for messages: "attach token of tenant a".
func scope(p auth.Principal) string {
	if p.Tenant == "" {
		return fmt.Sprintf("%s token", p.Role)
	}
	return fmt.Sprintf("%s token of tenant %s", p.Role, p.Tenant)
}
