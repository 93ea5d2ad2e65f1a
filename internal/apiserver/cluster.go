package apiserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/auth"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/qos"
)

// Cluster is what the API needs of the node's cluster membership
// (cluster.Node, NodeCluster): the node's name and the nodes, the volumes'
// placements and the tenants' use (cluster.Volumes), and the role of this
// node for a volume (cluster.Primaries).
// Server.Cluster is nil on a single node.
type Cluster interface {
	Name() string // this node's
	ClusterName() string
	Nodes(ctx context.Context) ([]cluster.NodeInfo, error)
	// CreateCharged places spec and returns once every copy is made;
	// idempotent says whether an existing volume is the answer. A
	// tenant's volume is recorded with its charge to the tenant's quota,
	// in one etcd Txn.
	CreateCharged(ctx context.Context, spec api.VolumeSpec, key string,
		idempotent func(sameSpec bool, key string) bool, charge cluster.Charge) (cluster.Placement, bool, error)
	DeleteVolume(ctx context.Context, volume string) error
	// TenantUsage is what a tenant's placed volumes count, cluster-wide.
	TenantUsage(ctx context.Context, tenant string) (cluster.Usage, error)
	// ChargeSnapshots counts delta snapshots of a placed volume in its
	// tenant's usage; admit (nil: no quota) refuses a positive delta.
	ChargeSnapshots(ctx context.Context, volume string, delta int64, admit func(cluster.Usage) error) error
	// UpdateSpec records a change of a placed volume's capacity, labels or
	// QoS, and its charge, and returns the spec before it.
	UpdateSpec(ctx context.Context, volume string, ch cluster.SpecChange) (api.VolumeSpec, error)
	Placement(ctx context.Context, volume string) (cluster.Placement, bool, error)
	Placements(ctx context.Context) (map[string]cluster.Placement, error)
	Role(ctx context.Context, volume string) (cluster.Role, error)
}

// NodeCluster is node as the API sees it (Cluster).
func NodeCluster(node *cluster.Node) Cluster {
	return nodeCluster{node, node.Volumes(), node.Primaries()}
}

// nodeCluster serves Cluster from the node and the families of its keys.
type nodeCluster struct {
	*cluster.Node
	cluster.Volumes
	cluster.Primaries
}

var _ Cluster = nodeCluster{}

// errSingleNode refuses replicas above 1 without a cluster.
func errSingleNode(replicas int) error {
	return fmt.Errorf("replicas %d: this server is a single node (started without cluster flags) and each copy needs a node of its own; "+
		"see docs/cluster.md: %w", replicas, cluster.ErrNotEnoughNodes)
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) error {
	if s.Cluster == nil {
		info, err := s.pool.Info()
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, api.List[api.Node]{Items: []api.Node{{Name: "local", Address: r.Host, State: api.NodeUp,
			CapacityBytes: info.TotalBytes, FreeBytes: info.FreeBytes, Volumes: info.Volumes, Self: true}}})
		return nil
	}
	nodes, err := s.Cluster.Nodes(r.Context())
	if err != nil {
		return fmt.Errorf("%w: %w", errUnavailable, err)
	}
	out := api.List[api.Node]{Items: make([]api.Node, 0, len(nodes))}
	for _, n := range nodes {
		out.Items = append(out.Items, nodeToAPI(n, s.Cluster.Name()))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// createClusterVolume places a volume on the cluster's nodes; spec.Name is
// the pool's name and spec.Tenant the volume's tenant (createName). A
// tenant's volume is admitted against the tenant's quotas, counted
// cluster-wide in etcd (docs/security.md, "Tenants on a cluster"). The
// answer is this node's copy when it holds one, else the volume as placed.
func (s *Server) createClusterVolume(w http.ResponseWriter, r *http.Request, spec api.VolumeSpec, idem pool.Idempotency) error {
	ps := pool.VolumeSpec{Name: spec.Name, Capacity: spec.Capacity, Labels: spec.Labels,
		Disks: diskSpecsFromAPI(spec.Disks), QoS: qosFromAPI(spec.QoS), Replicas: spec.Replicas, Tenant: spec.Tenant}
	if err := pool.ValidateSpec(ps); err != nil {
		return err
	}
	if spec.Encrypt {
		return &pool.FieldError{Field: "encrypt", Rule: "encrypted volumes are not built for a cluster yet (docs/encryption.md)"}
	}
	allows := func(same bool, stored string) bool {
		return same && (idem.SameSpec || (idem.Key != "" && idem.Key == stored))
	}
	p, created, err := s.Cluster.CreateCharged(r.Context(), spec, idem.Key, allows, s.charge(spec.Tenant, ps))
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, viewOf(r).volume(s.clusterVolume(p)))
	return nil
}

// charge is what a new volume of tenant counts against its quotas, with
// the check of auth.Quota.Admit on the tenant's cluster-wide usage.
func (s *Server) charge(tenant string, ps pool.VolumeSpec) cluster.Charge {
	add := chargeOf(ps.Capacity, ps.QoS)
	c := cluster.Charge{Add: add}
	if tenant == "" || s.Auth == nil {
		return c
	}
	c.Admit = func(u cluster.Usage) error {
		return s.Auth.Quota(tenant).Admit(tenant, usageToQuota(u),
			auth.Quota{Volumes: add.Volumes, Capacity: add.Capacity, IOPS: auth.IOPS(ps.QoS)})
	}
	return c
}

// chargeOf is what a volume of that capacity and QoS counts in its
// tenant's usage.
func chargeOf(capacity int64, q qos.Limits) cluster.Usage {
	u := cluster.Usage{Volumes: 1, Capacity: capacity}
	if iops := auth.IOPS(q); iops == auth.Unlimited {
		u.NoIOPSLimit = 1
	} else {
		u.IOPS = iops
	}
	return u
}

// updateClusterVolume changes the capacity, labels or QoS of a placed
// volume (this node holds its copy, and is its primary when it has more:
// the guards made sure). The change is recorded in etcd first, with the
// tenant's usage and the quota check (grow is what the change adds), so a
// refused change changes nothing; then made here, and on every copy at one
// cut when there are more (Replicated.Update). When the change fails here
// the record is put back as it was.
func (s *Server) updateClusterVolume(r *http.Request, v *pool.Volume, u api.VolumeUpdate, grow auth.Quota) (pool.VolumeInfo, error) {
	ctx := r.Context()
	tenant := v.Tenant()
	ch := cluster.SpecChange{Update: u, Charge: func(spec api.VolumeSpec) cluster.Usage {
		return chargeOf(spec.Capacity, qosFromAPI(spec.QoS))
	}}
	if tenant != "" && s.Auth != nil {
		ch.Admit = func(used cluster.Usage) error {
			return s.Auth.Quota(tenant).Admit(tenant, usageToQuota(used), grow)
		}
	}
	s.updateMu.Lock()
	defer s.updateMu.Unlock()
	before := v.Info()
	prev, err := s.Cluster.UpdateSpec(ctx, v.Name(), ch)
	if err != nil {
		if errors.Is(err, auth.ErrQuota) {
			return pool.VolumeInfo{}, err
		}
		return pool.VolumeInfo{}, fmt.Errorf("%w: %w", errUnavailable, err)
	}
	var info pool.VolumeInfo
	replicated, err := s.replicated(r, v.Name())
	if err == nil && replicated {
		info, err = s.Replicated.Update(ctx, v.Name(), u)
	} else if err == nil {
		info, err = v.Update(ctx, updateFromAPI(u))
	}
	if err != nil && sameSettings(v.Info(), before) {
		// Nothing changed here: the record goes back to what it was.
		ch.Update, ch.Admit = cluster.UpdateOf(prev), nil
		if _, uerr := s.Cluster.UpdateSpec(context.WithoutCancel(ctx), v.Name(), ch); uerr != nil {
			s.log.Error("put back the record of a volume update that failed", "volume", v.Name(), "err", uerr)
		}
	}
	return info, err
}

// placed says whether volume is placed in the cluster (false on a single
// node); etcd out of reach refuses.
func (s *Server) placed(ctx context.Context, volume string) (bool, error) {
	if s.Cluster == nil {
		return false, nil
	}
	_, ok, err := s.Cluster.Placement(ctx, volume)
	if err != nil {
		return false, fmt.Errorf("%w: %w", errUnavailable, err)
	}
	return ok, nil
}

// sameSettings says whether a and b have the same capacity, labels and QoS.
func sameSettings(a, b pool.VolumeInfo) bool {
	return a.Capacity == b.Capacity && a.QoS == b.QoS && maps.Equal(a.Labels, b.Labels)
}

// usageToQuota is a cluster-wide use in the terms of auth.Quota: any volume
// without an IOPS limit makes the IOPS use unlimited.
func usageToQuota(u cluster.Usage) auth.Quota {
	q := auth.Quota{Volumes: u.Volumes, Capacity: u.Capacity, IOPS: u.IOPS, Snapshots: u.Snapshots}
	if u.NoIOPSLimit > 0 {
		q.IOPS = auth.Unlimited
	}
	return q
}

// clusterVolumeOf returns the placement of the volume the caller calls
// name (false when it is not placed); a volume of another tenant is not
// found, with the message of an absent one.
func (s *Server) clusterVolumeOf(r *http.Request, name string) (cluster.Placement, bool, error) {
	p := principalOf(r)
	pn, err := poolName(p, name)
	if err != nil {
		return cluster.Placement{}, false, err
	}
	pl, ok, err := s.Cluster.Placement(r.Context(), pn)
	if err != nil {
		return cluster.Placement{}, false, fmt.Errorf("%w: %w", errUnavailable, err)
	}
	if ok && !p.Sees(pl.Spec.Tenant) {
		return cluster.Placement{}, false, fmt.Errorf("volume %q: %w", name, pool.ErrVolumeNotFound)
	}
	return pl, ok, nil
}

// listClusterVolumes lists a tenant's volumes from their placements, the
// same on every node.
func (s *Server) listClusterVolumes(w http.ResponseWriter, r *http.Request, match func(map[string]string) bool) error {
	ps, err := s.Cluster.Placements(r.Context())
	if err != nil {
		return fmt.Errorf("%w: %w", errUnavailable, err)
	}
	p := principalOf(r)
	out := api.List[api.Volume]{Items: []api.Volume{}}
	for _, pl := range ps {
		// A volume being deleted is listed, in state deleting, until its
		// last copy is gone.
		if pl.Spec.Tenant == "" || !p.Sees(pl.Spec.Tenant) || (match != nil && !match(pl.Spec.Labels)) {
			continue
		}
		out.Items = append(out.Items, viewOf(r).volume(s.clusterVolume(pl)))
	}
	slices.SortFunc(out.Items, func(a, b api.Volume) int { return cmp.Compare(a.Name, b.Name) })
	writeJSON(w, http.StatusOK, out)
	return nil
}

// clusterVolume is a placed volume: this node's copy, with the placement
// (withPlacement), so the same volume whichever node is asked.
func (s *Server) clusterVolume(p cluster.Placement) api.Volume {
	var out api.Volume
	if v, err := s.pool.Volume(p.Volume); err == nil {
		out = volumeToAPI(v.Info())
	} else {
		out = api.Volume{Name: p.Volume, Tenant: p.Spec.Tenant, UID: p.UID, Capacity: p.Spec.Capacity, Labels: p.Spec.Labels, QoS: p.Spec.QoS,
			Disks: []api.Disk{}, CreatedAt: p.CreatedAt}
		for _, d := range p.Spec.Disks {
			out.Disks = append(out.Disks, api.Disk{Name: d.Name, Size: d.Size, Shared: d.Shared})
		}
	}
	withPlacement(&out, p)
	return out
}

// withPlacement adds the placement p to v, a copy of it or its record:
// the UID is the cluster's, which every node answers, never a copy's
// local one (each node's copy has its own).
func withPlacement(v *api.Volume, p cluster.Placement) {
	if p.UID != "" {
		v.UID = p.UID
	}
	v.Replicas, v.Primary, v.Term = max(p.Replicas, 1), p.Primary, p.Term
	v.Copies = make([]api.Copy, 0, len(p.Copies))
	for _, c := range p.Copies {
		ac := api.Copy{Node: c.Node, State: c.State, Reason: c.Reason}
		if p.Deleting && c.State == "" {
			// Its record went with it: this copy is deleted, not
			// being made.
			ac.State = api.CopyDeleted
		}
		if c.Progress != nil {
			pct := c.Progress.Percent()
			ac.Progress, ac.DoneBytes, ac.TotalBytes = &pct, c.Progress.DoneBytes, c.Progress.TotalBytes
		}
		v.Copies = append(v.Copies, ac)
	}
	if p.Deleting {
		v.State = api.VolumeDeleting
	}
}

// refuseDeleting refuses a change of a volume being deleted.
func refuseDeleting(p cluster.Placement) error {
	var left []string
	for _, c := range p.Copies {
		if c.State != "" {
			left = append(left, c.Node)
		}
	}
	return fmt.Errorf("volume %q is being deleted (copies left on %s): it takes no attachment, snapshot, clone or other change, "+
		"and its name no new volume, until its last copy is gone (a copy's node that is down deletes it when it is back): %w",
		p.Volume, strings.Join(left, ", "), cluster.ErrVolumeDeleting)
}

// getClusterVolume answers GET of a volume in a cluster: any node answers
// for any placed volume.
func (s *Server) getClusterVolume(w http.ResponseWriter, r *http.Request) error {
	p, ok, err := s.clusterVolumeOf(r, r.PathValue("volume"))
	if err != nil {
		return err
	}
	if !ok {
		// A volume made before the node joined a cluster is this node's
		// alone.
		v, err := s.volume(r)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, viewOf(r).volume(volumeToAPI(v.Info())))
		return nil
	}
	writeJSON(w, http.StatusOK, viewOf(r).volume(s.clusterVolume(p)))
	return nil
}

func (s *Server) deleteClusterVolume(w http.ResponseWriter, r *http.Request, recursive bool) error {
	pl, placed, err := s.clusterVolumeOf(r, r.PathValue("volume"))
	if err != nil {
		return err
	}
	if !placed {
		// Not placed: a volume of this node alone, if any.
		v, err := s.volume(r)
		if err != nil {
			return err
		}
		if err := s.pool.DeleteWith(r.Context(), v.Name(), pool.DeleteOptions{Recursive: recursive}); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	name := pl.Volume
	v, err := s.pool.Volume(name)
	if err == nil && !recursive && len(v.Snapshots()) > 0 {
		// The copy here has snapshots: refuse before any copy goes, as on
		// a single node.
		return fmt.Errorf("delete volume %q: it has %d snapshots; delete them first, or delete them with it (quiver volume delete --recursive): %w",
			name, len(v.Snapshots()), pool.ErrHasSnapshots)
	}
	if err != nil && !recursive {
		// Only a node holding a copy can count the volume's snapshots, and
		// every copy's node deletes its copy whole: without this, a plain
		// delete asked of a node without a copy took the snapshots too.
		// The primary answers it instead.
		if carried, err := s.toPrimary(w, r, name); carried {
			return err
		}
		return fmt.Errorf("delete volume %q: this node holds no copy of it and its primary cannot be asked whether it has snapshots; "+
			"ask a node that holds a copy, or delete its snapshots with it (quiver volume delete --recursive): %w", name, errUnavailable)
	}
	err = s.Cluster.DeleteVolume(r.Context(), name)
	if errors.Is(err, cluster.ErrDeletePending) {
		// Accepted: the volume is deleting, and its copies' nodes finish
		// the delete by themselves.
		out := s.clusterVolume(pl)
		out.State, out.Reason = api.VolumeDeleting, err.Error()
		writeJSON(w, http.StatusAccepted, viewOf(r).volume(out))
		return nil
	}
	if errors.Is(err, cluster.ErrVolumeNotFound) {
		// Not placed: a volume of this node alone, if any.
		err = s.pool.DeleteWith(r.Context(), name, pool.DeleteOptions{Recursive: recursive})
	}
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// annotate adds the placements to a list of this node's volumes; a list
// without them is still right about this node, so an etcd failure is
// logged, not returned.
// It returns the placements (nil without).
func (s *Server) annotate(r *http.Request, vols []api.Volume) map[string]cluster.Placement {
	if s.Cluster == nil {
		return nil
	}
	ps, err := s.Cluster.Placements(r.Context())
	if err != nil {
		s.log.Warn("list placements", "err", err)
		return nil
	}
	for i := range vols {
		if p, ok := ps[vols[i].Name]; ok {
			withPlacement(&vols[i], p)
		}
	}
	return ps
}

// placedElsewhere are the placed volumes (ps) that the caller sees and
// match selects but this node holds no copy of (not in here): with them a
// list of this node's volumes is the cluster's, whichever node is asked.
// A volume being deleted is among them, in state deleting, until its last
// copy is gone.
func (s *Server) placedElsewhere(r *http.Request, ps map[string]cluster.Placement, here []api.Volume,
	match func(map[string]string) bool) []api.Volume {
	held := map[string]bool{}
	for _, v := range here {
		held[v.Name] = true
	}
	p := principalOf(r)
	var out []api.Volume
	for name, pl := range ps {
		if held[name] || !p.Sees(pl.Spec.Tenant) || (match != nil && !match(pl.Spec.Labels)) {
			continue
		}
		out = append(out, s.clusterVolume(pl))
	}
	return out
}

// What a route may do to a volume with more than one copy.
type replicatedGuard int

const (
	onPrimary   replicatedGuard = iota // only the primary serves it
	notYetBuilt                        // refused: it would change one copy only
	onACopy                            // a read any copy answers; without one, the primary
)

// replicatedGuards are the routes on one volume that a replicated volume
// restricts. Snapshots, rollback and disk changes go through the primary,
// which applies them to every copy at one cut (Replicated). A route marked
// notYetBuilt would change one copy only: refused.
var replicatedGuards = map[string]replicatedGuard{
	// Capacity, labels and QoS: recorded in etcd and changed on every
	// copy by the primary (updateClusterVolume).
	"PATCH /v1/volumes/{volume}":                        onPrimary,
	"POST /v1/volumes/{volume}/attachments":             onPrimary,
	"POST /v1/volumes/{volume}/attachments/{id}/writer": onPrimary,
	"POST /v1/volumes/{volume}/disks":                   onPrimary,
	"PATCH /v1/volumes/{volume}/disks/{disk}":           onPrimary,
	"DELETE /v1/volumes/{volume}/disks/{disk}":          onPrimary,
	"POST /v1/volumes/{volume}/snapshots":               onPrimary,
	"DELETE /v1/volumes/{volume}/snapshots/{snapshot}":  onPrimary,
	// A cluster's volumes never hand out their files (the endpoint path).
	"PUT /v1/volumes/{volume}/direct-access/{holder}":    notYetBuilt,
	"DELETE /v1/volumes/{volume}/direct-access/{holder}": notYetBuilt,
	// A backup of a cluster's volume runs on its primary, whose change
	// tracking saw every write, and snapshots every copy at one cut.
	"POST /v1/volumes/{volume}/backups": onPrimary,
	// Schedules of a cluster's volumes are not built yet: a policy kept on
	// one copy would be lost with it.
	"PUT /v1/volumes/{volume}/backup-policy":    notYetBuilt,
	"DELETE /v1/volumes/{volume}/backup-policy": notYetBuilt,
	// The primary's change tracking saw every write the VM made.
	"GET /v1/volumes/{volume}/snapshots/{snapshot}/changes": onPrimary,
	"POST /v1/volumes/{volume}/rollback":                    onPrimary,
	// Detach, and the attachments read, on the primary, which holds them
	// (a copy's node holds only the primary's replication attachment).
	"DELETE /v1/volumes/{volume}/attachments/{id}": onPrimary,
	"GET /v1/volumes/{volume}/attachments":         onPrimary,
	// The VM's I/O goes through its primary's data path.
	"GET /v1/volumes/{volume}/stats":            onPrimary,
	"GET /v1/volumes/{volume}/attachments/{id}": onPrimary,
	// A copy holds the snapshots of the volume as the primary does (a
	// copy's own is what a check of it reads); a node without one asks the
	// primary.
	"GET /v1/volumes/{volume}/snapshots":            onACopy,
	"GET /v1/volumes/{volume}/snapshots/{snapshot}": onACopy,
	// A snapshot's images are the same on every copy.
	"GET /v1/volumes/{volume}/snapshots/{snapshot}/allocated": onACopy,
}

func (s *Server) guardReplicated(g replicatedGuard, h func(http.ResponseWriter, *http.Request) error) func(http.ResponseWriter, *http.Request) error {
	return func(w http.ResponseWriter, r *http.Request) error {
		if s.Cluster == nil {
			return h(w, r)
		}
		// The caller's name, in its scope: another tenant's volume is
		// not found here, before its role could say anything of it.
		pl, placed, err := s.clusterVolumeOf(r, r.PathValue("volume"))
		if err != nil {
			return err // etcd out of reach refuses: this node cannot know whether it is the primary
		}
		if !placed {
			return h(w, r) // this node's alone, or absent: the handler answers
		}
		name := pl.Volume
		if pl.Deleting && r.Method != http.MethodGet && r.Method != http.MethodDelete {
			return refuseDeleting(pl) // a detach, or a snapshot's delete, goes on
		}
		if g == onACopy {
			if _, err := s.pool.Volume(name); err == nil {
				return h(w, r) // this node's copy answers
			}
		}
		if g == onPrimary || g == onACopy {
			// Another node's volume is carried to its primary
			// (forward.go), whatever its number of copies.
			if done, err := s.toPrimary(w, r, name); done {
				return err
			}
		}
		if g == onACopy {
			return h(w, r)
		}
		role, err := s.Cluster.Role(r.Context(), name)
		if err != nil {
			return fmt.Errorf("%w: %w", errUnavailable, err)
		}
		if !role.Placed || role.Replicas <= 1 {
			return h(w, r)
		}
		switch {
		case g == notYetBuilt:
			return fmt.Errorf("%s %s: volume %q has %d copies, and this change must reach all of them at one cut, "+
				"which is not built yet (docs/cluster.md): %w", r.Method, r.URL.Path, name, role.Replicas, cluster.ErrNotSupported)
		case !role.IsPrimary(s.Cluster.Name()):
			return fmt.Errorf("%s %s: volume %q is served by its primary %s (API %s), not by this node: %w",
				r.Method, r.URL.Path, name, role.Primary, role.PrimaryAPI, cluster.ErrNotPrimary)
		}
		return h(w, r)
	}
}

// Replicated is what the API needs to change every copy of a replicated
// volume at one cut (the server's replication sets).
type Replicated interface {
	Snapshot(ctx context.Context, volume, name string, idem pool.Idempotency, prog pool.Progress) (pool.SnapshotInfo, bool, error)
	DeleteSnapshot(ctx context.Context, volume, name string) error
	// Rollback releases h.
	Rollback(ctx context.Context, h *pool.Hold, volume, snapshot string, force bool, prog pool.Progress) (pool.VolumeInfo, error)
	AddDisk(ctx context.Context, volume string, d pool.DiskSpec, idem pool.Idempotency) (pool.VolumeInfo, error)
	GrowDisk(ctx context.Context, volume, disk string, size int64) (pool.VolumeInfo, error)
	RemoveDisk(ctx context.Context, volume, disk string, force bool) (pool.VolumeInfo, error)
	// Update changes the capacity, labels or QoS limits of every copy.
	Update(ctx context.Context, volume string, u api.VolumeUpdate) (pool.VolumeInfo, error)
	// Clone releases h.
	// charge is what each clone of a tenant counts, checked and recorded
	// as it is placed.
	Clone(ctx context.Context, h *pool.CloneHold, req pool.CloneRequest, charge func(api.VolumeSpec) cluster.Charge,
		prog pool.Progress) ([]pool.VolumeInfo, error)
}

// replicated says whether volume is a cluster volume with more than one
// copy (this node being its primary: the guards made sure).
func (s *Server) replicated(r *http.Request, volume string) (bool, error) {
	if s.Cluster == nil || s.Replicated == nil {
		return false, nil
	}
	role, err := s.Cluster.Role(r.Context(), volume)
	if err != nil {
		return false, fmt.Errorf("%w: %w", errUnavailable, err)
	}
	return role.Placed && role.Replicas > 1, nil
}

// replicatedClone says whether a clone of source must be made on every
// copy of a replicated volume (Replicated.Clone), which only its primary
// does: elsewhere it is refused (ErrNotPrimary, naming the primary). A
// tenant's clone of a placed volume with one copy is placed the same way,
// so that it is the tenant's on every node and counted in etcd.
func (s *Server) replicatedClone(r *http.Request, source, tenant string) (bool, error) {
	if s.Cluster == nil {
		return false, nil
	}
	role, err := s.Cluster.Role(r.Context(), source)
	if err != nil {
		return false, fmt.Errorf("%w: %w", errUnavailable, err)
	}
	if !role.Placed || (role.Replicas <= 1 && (tenant == "" || s.Replicated == nil)) {
		return false, nil
	}
	if s.Replicated == nil {
		return false, fmt.Errorf("clone of %q: it has %d copies, and this node cannot clone them (docs/cluster.md): %w",
			source, role.Replicas, cluster.ErrNotSupported)
	}
	if !role.IsPrimary(s.Cluster.Name()) {
		return false, fmt.Errorf("clone of %q: it is cloned by its primary %s (API %s), not by this node: %w",
			source, role.Primary, role.PrimaryAPI, cluster.ErrNotPrimary)
	}
	return true, nil
}

// reserveSnapshot counts a new snapshot of v in its tenant's quota, and
// returns what to call when it is done: kept says whether the snapshot was
// made (else the count is given back). On a cluster, the snapshots of a
// placed volume are counted in etcd, cluster-wide, as its creation was
// (cluster.Volumes.ChargeSnapshots); elsewhere in this node's pool.
func (s *Server) reserveSnapshot(ctx context.Context, v *pool.Volume) (func(kept bool), error) {
	tenant := v.Tenant()
	if s.Cluster == nil || tenant == "" || s.Auth == nil {
		release, err := s.reserve(tenant, auth.Quota{Snapshots: 1})
		return func(bool) { release() }, err
	}
	if _, placed, err := s.Cluster.Placement(ctx, v.Name()); err != nil {
		return nil, fmt.Errorf("%w: %w", errUnavailable, err)
	} else if !placed {
		release, err := s.reserve(tenant, auth.Quota{Snapshots: 1})
		return func(bool) { release() }, err
	}
	admit := func(u cluster.Usage) error {
		return s.Auth.Quota(tenant).Admit(tenant, usageToQuota(u), auth.Quota{Snapshots: 1})
	}
	if err := s.Cluster.ChargeSnapshots(ctx, v.Name(), 1, admit); err != nil {
		if errors.Is(err, auth.ErrQuota) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", errUnavailable, err)
	}
	return func(kept bool) {
		if !kept {
			s.unchargeSnapshot(v.Name())
		}
	}, nil
}

// unchargeSnapshot gives back a snapshot of a placed volume of a tenant;
// a failure is logged: the count stays above the truth, which can only
// refuse, never let a tenant past its quota.
func (s *Server) unchargeSnapshot(volume string) {
	if s.Cluster == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Cluster.ChargeSnapshots(ctx, volume, -1, nil); err != nil && !errors.Is(err, cluster.ErrVolumeNotFound) {
		s.log.Error("give back a snapshot of the tenant's quota", "volume", volume, "err", err)
	}
}

// cloneCharge is what a placed clone counts in its tenant's usage, with
// the tenant's quota check (Replicated.Clone).
func (s *Server) cloneCharge(spec api.VolumeSpec) cluster.Charge {
	return s.charge(spec.Tenant, pool.VolumeSpec{Capacity: spec.Capacity, QoS: qosFromAPI(spec.QoS)})
}

// admitClusterClones checks, before a clone starts, that tenant's
// cluster-wide usage takes add (the clones of src); each clone is checked
// again, and counted, as it is placed.
func (s *Server) admitClusterClones(ctx context.Context, tenant string, src *pool.Volume, add auth.Quota) error {
	if s.Auth == nil {
		return nil
	}
	u, err := s.Cluster.TenantUsage(ctx, tenant)
	if err != nil {
		return fmt.Errorf("%w: %w", errUnavailable, err)
	}
	add.IOPS = auth.IOPS(src.Info().QoS) * add.Volumes
	if auth.IOPS(src.Info().QoS) == auth.Unlimited {
		add.IOPS = auth.Unlimited
	}
	return s.Auth.Quota(tenant).Admit(tenant, usageToQuota(u), add)
}
