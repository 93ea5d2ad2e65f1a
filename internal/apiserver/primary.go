package apiserver

import (
	"fmt"
	"net/http"

	"github.com/quiverstorage/quiver/internal/api"
)

// getPrimary answers where the volume's disks are served now: on a
// cluster its primary and that node's NBD address, on a single node this
// node. A primary that is down (its lease expired, no promotion yet) or a
// node that serves no NBD over TCP is 503 Unavailable: the caller (a
// compute node's endpoint) asks again.
func (s *Server) getPrimary(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("volume")
	if s.Cluster == nil {
		v, err := s.volume(r)
		if err != nil {
			return err
		}
		if s.nbd.Addr == "" {
			return fmt.Errorf("volume %q: this node serves NBD on no TCP address (--nbd): %w", name, errNoNBD)
		}
		writeJSON(w, http.StatusOK, api.Primary{Volume: viewOf(r).name(v.Name()), Node: "local",
			NBD: reachableHost(s.nbd.Addr, r.Host), TLS: s.nbd.TLS})
		return nil
	}
	pl, ok, err := s.clusterVolumeOf(r, name)
	if err != nil {
		return err
	}
	if !ok {
		// A volume of this node alone (made before it joined a cluster).
		if _, err := s.volume(r); err != nil {
			return err
		}
		if s.nbd.Addr == "" {
			return fmt.Errorf("volume %q: this node serves NBD on no TCP address (--nbd): %w", name, errNoNBD)
		}
		writeJSON(w, http.StatusOK, api.Primary{Volume: name, Node: s.Cluster.Name(),
			NBD: reachableHost(s.nbd.Addr, r.Host), TLS: s.nbd.TLS})
		return nil
	}
	if pl.Primary == "" {
		return fmt.Errorf("volume %q has no primary now (a failover is under way): %w", name, errNoPrimary)
	}
	nodes, err := s.Cluster.Nodes(r.Context())
	if err != nil {
		return fmt.Errorf("%w: %w", errUnavailable, err)
	}
	for _, n := range nodes {
		if n.Name != pl.Primary {
			continue
		}
		if !n.Up || n.NBD == "" {
			return fmt.Errorf("volume %q: its primary %s is down (a failover is under way): %w", name, n.Name, errNoPrimary)
		}
		writeJSON(w, http.StatusOK, api.Primary{Volume: name, Node: n.Name, NBD: n.NBD, TLS: s.nbd.TLS, Term: pl.Term})
		return nil
	}
	return fmt.Errorf("volume %q: its primary %s is not a member: %w", name, pl.Primary, errNoPrimary)
}
