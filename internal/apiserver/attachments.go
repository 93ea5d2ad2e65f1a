package apiserver

import (
	"fmt"
	"net"
	"net/http"
	"net/url"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/dr"
	"github.com/quiverstorage/quiver/internal/pool"
)

func (s *Server) listAttachments(w http.ResponseWriter, r *http.Request) error {
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	out := api.List[api.Attachment]{Items: []api.Attachment{}}
	for _, a := range v.Attachments() {
		out.Items = append(out.Items, viewOf(r).attachment(attachmentToAPI(a)))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// findAttachments lists the attachments of every volume matching the
// selector (all volumes when none), by volume name.
func (s *Server) findAttachments(w http.ResponseWriter, r *http.Request) error {
	match, err := selector(r)
	if err != nil {
		return err
	}
	if s.Cluster != nil && principalOf(r).Tenant != "" {
		return s.findClusterAttachments(w, r, match)
	}
	out := api.List[api.Attachment]{Items: []api.Attachment{}}
	for _, info := range s.visible(r, match) {
		v, err := s.pool.Volume(info.Name)
		if err != nil {
			continue // deleted since List, or quarantined: nothing attached to serve
		}
		for _, a := range v.Attachments() {
			out.Items = append(out.Items, viewOf(r).attachment(attachmentToAPI(a)))
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) attach(w http.ResponseWriter, r *http.Request) error {
	var spec api.AttachmentSpec
	if err := decode(r, &spec); err != nil {
		return err
	}
	idem, err := idempotency(r)
	if err != nil {
		return err
	}
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	if rel := v.Info().Labels[dr.RelationshipLabel]; rel != "" && spec.Mode != pool.ModeReadOnly {
		return fmt.Errorf("volume %s is the DR target of relationship %s: its source overwrites it at every point; "+
			"attach it read-only (--mode ro), or promote it first (quiver dr target promote %s): %w", v.Name(), rel, rel, pool.ErrInvalid)
	}
	a, created, err := v.AttachWith(spec.Node, spec.Mode, idem)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		s.log.Info("attached", "volume", v.Name(), "attachment", a.ID, "node", a.Node, "mode", a.Mode)
	}
	out := viewOf(r).attachment(attachmentToAPI(a))
	info := v.Info()
	if s.Cluster == nil {
		info.Name = viewOf(r).name(info.Name) // the tenant's name reaches the attachment too
	}
	// On a cluster node the URIs keep the pool's name (<tenant>--<name>):
	// that is the name the node's NBD server places, forwards and
	// replicates by (docs/security.md, "Tenants on a cluster").
	out.URIs = s.nbdURIs(r, info, a.Token)
	writeJSON(w, status, out)
	return nil
}

// NBDEndpoint is where the node serves NBD, for the URIs of attach answers.
type NBDEndpoint struct {
	Addr   string // host:port of NBD over TCP; "" when not served
	Socket string // path of the NBD unix socket; "" when not served
	TLS    bool   // TLS is required: the URIs are nbds://
}

// SetNBD tells the API where NBD is served; set it before serving.
func (s *Server) SetNBD(e NBDEndpoint) { s.nbd = e }

// nbdURIs returns the NBD URI of every disk of vol for token, by disk
// name: over TCP when served (a wildcard listen address is replaced by the
// host the client reached the API at), else on the unix socket; nil when
// NBD is not served or there is no token.
func (s *Server) nbdURIs(r *http.Request, vol pool.VolumeInfo, token string) map[string]string {
	if token == "" || (s.nbd.Addr == "" && s.nbd.Socket == "") {
		return nil
	}
	uris := make(map[string]string, len(vol.Disks))
	for _, d := range vol.Disks {
		export := vol.Name + "/" + d.Name + "/" + token
		u := url.URL{Path: "/" + export}
		switch {
		case s.nbd.Addr != "":
			u.Scheme, u.Host = "nbd", reachableHost(s.nbd.Addr, r.Host)
			if s.nbd.TLS {
				u.Scheme = "nbds"
			}
		default:
			u.Scheme, u.RawQuery = "nbd+unix", url.Values{"socket": {s.nbd.Socket}}.Encode()
			if s.nbd.TLS {
				u.Scheme = "nbds+unix"
			}
		}
		uris[d.Name] = u.String()
	}
	return uris
}

// reachableHost returns addr (host:port) with an unspecified host (0.0.0.0,
// ::) replaced by the host of apiHost, the Host the client used.
func reachableHost(addr, apiHost string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if h, _, err := net.SplitHostPort(apiHost); err == nil {
			host = h
		} else if apiHost != "" {
			host = apiHost
		}
	}
	return net.JoinHostPort(host, port)
}

func (s *Server) getAttachment(w http.ResponseWriter, r *http.Request) error {
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	a, err := v.Attachment(r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, viewOf(r).attachment(attachmentToAPI(a)))
	return nil
}

func (s *Server) detach(w http.ResponseWriter, r *http.Request) error {
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	if err := v.Detach(id); err != nil {
		return err
	}
	s.log.Info("detached", "volume", v.Name(), "attachment", id)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) transferWriter(w http.ResponseWriter, r *http.Request) error {
	var body struct{}
	if err := decode(r, &body); err != nil {
		return err
	}
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	a, err := v.Transfer(r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, viewOf(r).attachment(attachmentToAPI(a)))
	return nil
}
