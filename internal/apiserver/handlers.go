package apiserver

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/auth"
	"github.com/quiverstorage/quiver/internal/buildinfo"
	"github.com/quiverstorage/quiver/internal/job"
	"github.com/quiverstorage/quiver/internal/pool"
)

// getPool answers GET /v1/pool: this node's pool, and on a cluster for a
// caller without a tenant the cluster's as well (clusterPool), or for a
// tenant its own part of it (tenantPool).
func (s *Server) getPool(w http.ResponseWriter, r *http.Request) error {
	info, err := s.pool.Info()
	if err != nil {
		return err
	}
	c := info.Caps
	out := api.PoolInfo{ID: info.ID, Path: info.Dir, Filesystem: c.Filesystem,
		Capabilities: api.Capabilities{Reflink: c.Reflink, CopyFileRange: c.CopyFileRange, SeekHole: c.SeekHole,
			BtrfsSubvolumes: c.BtrfsSubvolumes, ExtentSizeHint: c.ExtentSizeHint},
		TotalBytes: info.TotalBytes, FreeBytes: info.FreeBytes, ProvisionedBytes: s.provisioned(),
		Volumes: info.Volumes, CreatedAt: info.CreatedAt,
		ChunkSize: info.ChunkSize, ReadOnly: info.ReadOnly, Broken: info.Broken}
	if s.Cluster != nil {
		out.Cluster = s.Cluster.ClusterName()
	}
	if t := principalOf(r).Tenant; t != "" {
		if err := s.tenantPool(r, t, &out); err != nil {
			return err
		}
	} else if s.Cluster != nil {
		out.ClusterPool = s.clusterPool(r)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// tenantPool narrows the pool's answer to a tenant: its own volume count
// and provisioned bytes (on a cluster node, of its placed volumes, the same
// on every node), none of the node's quarantined volumes, and its quota
// with its use (cluster-wide on a cluster). The pool's identity, its
// capabilities and its space are this node's, as for anyone: they say
// nothing of another tenant's volumes.
func (s *Server) tenantPool(r *http.Request, tenant string, out *api.PoolInfo) error {
	out.Volumes, out.Broken, out.ProvisionedBytes = 0, 0, 0
	if s.Cluster != nil {
		n, prov, err := s.tenantPoolCounts(r)
		if err != nil {
			return err
		}
		out.Volumes, out.ProvisionedBytes = n, prov
	} else {
		for _, v := range s.visible(r, nil) {
			out.Volumes++
			for _, d := range v.Disks {
				out.ProvisionedBytes += d.Size
			}
		}
	}
	if s.Auth == nil {
		return nil
	}
	used, err := s.tenantUse(r, tenant)
	if err != nil {
		return err
	}
	out.Tenant = &api.Tenant{Name: tenant, Quota: quotaToAPI(s.Auth.Quota(tenant)), Used: quotaToAPI(used)}
	return nil
}

// selector parses the request's label selector (?selector=k=v,k2=v2) into
// a match function, nil when there is none.
func selector(r *http.Request) (func(map[string]string) bool, error) {
	q := r.URL.Query().Get("selector")
	if q == "" {
		return nil, nil
	}
	sel, err := labels.Parse(q)
	if err != nil {
		return nil, &badRequest{field: "selector", msg: fmt.Sprintf("selector %q: %v", q, err)}
	}
	return func(l map[string]string) bool { return sel.Matches(labels.Set(l)) }, nil
}

func (s *Server) getVersion(w http.ResponseWriter, _ *http.Request) error {
	writeJSON(w, http.StatusOK, buildinfo.Get())
	return nil
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request) error {
	match, err := selector(r)
	if err != nil {
		return err
	}
	if s.Cluster != nil && principalOf(r).Tenant != "" {
		return s.listClusterVolumes(w, r, match)
	}
	vols := s.visible(r, match)
	out := api.List[api.Volume]{Items: make([]api.Volume, 0, len(vols))}
	for _, v := range vols {
		out.Items = append(out.Items, volumeToAPI(v))
	}
	ps := s.annotate(r, out.Items)
	out.Items = append(out.Items, s.placedElsewhere(r, ps, out.Items, match)...)
	slices.SortFunc(out.Items, func(a, b api.Volume) int { return cmp.Compare(a.Name, b.Name) })
	for i := range out.Items {
		out.Items[i] = viewOf(r).volume(out.Items[i])
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request) error {
	var spec api.VolumeSpec
	if err := decode(r, &spec); err != nil {
		return err
	}
	idem, err := idempotency(r)
	if err != nil {
		return err
	}
	tenant, name, err := s.createName(r, spec.Tenant, spec.Name)
	if err != nil {
		return err
	}
	if s.Cluster != nil {
		spec.Tenant, spec.Name = tenant, name
		return s.createClusterVolume(w, r, spec, idem)
	}
	ps := pool.VolumeSpec{Name: name, Capacity: spec.Capacity, Labels: spec.Labels,
		Disks: diskSpecsFromAPI(spec.Disks), QoS: qosFromAPI(spec.QoS), Replicas: spec.Replicas, Idempotency: idem,
		Tenant: tenant, Encrypt: spec.Encrypt}
	if err := pool.ValidateSpec(ps); err != nil {
		return err
	}
	if spec.Replicas > 1 {
		return errSingleNode(spec.Replicas)
	}
	var size int64
	for _, d := range spec.Disks {
		size += d.Size
	}
	if err := s.checkOvercommit(size); err != nil {
		return err
	}
	release, err := s.reserve(tenant, auth.Quota{Volumes: 1, Capacity: spec.Capacity, IOPS: auth.IOPS(ps.QoS)})
	if err != nil {
		return err
	}
	defer release()
	info, created, err := s.pool.Create(r.Context(), ps)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	writeJSON(w, status, viewOf(r).volume(volumeToAPI(info)))
	return nil
}

// createName returns the tenant and the pool name of a new volume: a
// tenant's token always creates in its tenant (naming another is
// forbidden); an admin may name any tenant.
func (s *Server) createName(r *http.Request, tenant, name string) (string, string, error) {
	p := principalOf(r)
	switch {
	case p.Tenant != "" && tenant != "" && tenant != p.Tenant:
		return "", "", fmt.Errorf("tenant %q: a token of tenant %q creates volumes of its own tenant only: %w", tenant, p.Tenant, auth.ErrForbidden)
	case p.Tenant != "":
		tenant = p.Tenant
	case tenant != "":
		if err := pool.ValidateTenant("tenant", tenant); err != nil {
			return "", "", err
		}
	}
	pn, err := poolName(auth.Principal{Tenant: tenant}, name)
	return tenant, pn, err
}

// volume is the request's {volume}, in the caller's scope.
func (s *Server) volume(r *http.Request) (*pool.Volume, error) {
	return s.volumeOf(r, r.PathValue("volume"))
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request) error {
	if s.Cluster != nil {
		return s.getClusterVolume(w, r)
	}
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, viewOf(r).volume(volumeToAPI(v.Info())))
	return nil
}

// getVolumeStats answers the volume's cumulative read and write counters
// and the time they were read: the console's live chart takes the
// difference of two.
func (s *Server) getVolumeStats(w http.ResponseWriter, r *http.Request) error {
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	if s.IO == nil {
		return fmt.Errorf("volume statistics: the server keeps no I/O counters: %w", pool.ErrNotSupported)
	}
	io := s.IO.VolumeIO(v.Name())
	writeJSON(w, http.StatusOK, api.VolumeStats{Volume: viewOf(r).name(v.Name()), Time: time.Now().UTC(),
		ReadOps: io.ReadOps, ReadBytes: io.ReadBytes, WriteOps: io.WriteOps, WriteBytes: io.WriteBytes})
	return nil
}

func (s *Server) updateVolume(w http.ResponseWriter, r *http.Request) error {
	var u api.VolumeUpdate
	if err := decode(r, &u); err != nil {
		return err
	}
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	upd := updateFromAPI(u)
	if err := v.CheckUpdate(upd); err != nil {
		return err
	}
	old := v.Info()
	var grow auth.Quota
	if u.Capacity != nil && *u.Capacity > old.Capacity {
		grow.Capacity = *u.Capacity - old.Capacity
	}
	if upd.QoS != nil {
		switch before, after := auth.IOPS(old.QoS), auth.IOPS(*upd.QoS); {
		case after == auth.Unlimited && before != auth.Unlimited:
			grow.IOPS = auth.Unlimited
		case after != auth.Unlimited && before != auth.Unlimited && after > before:
			grow.IOPS = after - before
		}
	}
	var info pool.VolumeInfo
	if placed, perr := s.placed(r.Context(), v.Name()); perr != nil {
		return perr
	} else if placed {
		// Counted in etcd, cluster-wide, and changed on every copy.
		info, err = s.updateClusterVolume(r, v, u, grow)
	} else {
		var release func()
		if release, err = s.reserve(v.Tenant(), grow); err != nil {
			return err
		}
		defer release()
		info, err = v.Update(r.Context(), upd)
	}
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, viewOf(r).volume(volumeToAPI(info)))
	return nil
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request) error {
	recursive, err := boolQuery(r, api.QueryRecursive)
	if err != nil {
		return err
	}
	o := pool.DeleteOptions{Recursive: recursive}
	if o.Shred, err = boolQuery(r, api.QueryShred); err != nil {
		return err
	}
	if s.Cluster != nil {
		if o.Shred || r.URL.Query().Has(api.QueryShredAlso) {
			// A delete that was asked to destroy keys must not go ahead
			// without: a cluster keeps no encrypted volume.
			return fmt.Errorf("shred: a cluster's volumes are not encrypted, so there are no keys to destroy; delete without shred: %w", pool.ErrInvalid)
		}
		return s.deleteClusterVolume(w, r, recursive)
	}
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	if also := r.URL.Query().Get(api.QueryShredAlso); also != "" {
		o.ShredAlso = strings.Split(also, ",")
		for _, n := range o.ShredAlso {
			if _, err := s.volumeOf(r, n); err != nil { // a tenant names only its own
				return err
			}
		}
	}
	if err := s.pool.DeleteWith(r.Context(), v.Name(), o); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) addDisk(w http.ResponseWriter, r *http.Request) error {
	var d api.DiskSpec
	if err := decode(r, &d); err != nil {
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
	if err := s.checkOvercommit(d.Size); err != nil {
		return err
	}
	rep, err := s.replicated(r, v.Name())
	if err != nil {
		return err
	}
	add := v.AddDiskWith
	if rep {
		add = func(ctx context.Context, d pool.DiskSpec, idem pool.Idempotency) (pool.VolumeInfo, error) {
			return s.Replicated.AddDisk(ctx, v.Name(), d, idem)
		}
	}
	info, err := add(r.Context(), pool.DiskSpec{Name: d.Name, Size: d.Size, Shared: d.Shared}, idem)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, viewOf(r).volume(volumeToAPI(info)))
	return nil
}

func (s *Server) growDisk(w http.ResponseWriter, r *http.Request) error {
	var u api.DiskUpdate
	if err := decode(r, &u); err != nil {
		return err
	}
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	for _, d := range v.Info().Disks {
		if d.Name == r.PathValue("disk") {
			if err := s.checkOvercommit(u.Size - d.Size); err != nil {
				return err
			}
		}
	}
	rep, err := s.replicated(r, v.Name())
	if err != nil {
		return err
	}
	grow := v.GrowDisk
	if rep {
		grow = func(ctx context.Context, disk string, size int64) (pool.VolumeInfo, error) {
			return s.Replicated.GrowDisk(ctx, v.Name(), disk, size)
		}
	}
	info, err := grow(r.Context(), r.PathValue("disk"), u.Size)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, viewOf(r).volume(volumeToAPI(info)))
	return nil
}

func (s *Server) removeDisk(w http.ResponseWriter, r *http.Request) error {
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	force, err := boolQuery(r, api.QueryForce)
	if err != nil {
		return err
	}
	rep, err := s.replicated(r, v.Name())
	if err != nil {
		return err
	}
	remove := v.RemoveDiskWith
	if rep {
		remove = func(ctx context.Context, disk string, force bool) (pool.VolumeInfo, error) {
			return s.Replicated.RemoveDisk(ctx, v.Name(), disk, force)
		}
	}
	info, err := remove(r.Context(), r.PathValue("disk"), force)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, viewOf(r).volume(volumeToAPI(info)))
	return nil
}

// findSnapshots lists the snapshots of every volume matching ?selector=,
// only those called ?name= when it is given.
func (s *Server) findSnapshots(w http.ResponseWriter, r *http.Request) error {
	match, err := selector(r)
	if err != nil {
		return err
	}
	name := r.URL.Query().Get("name")
	if name != "" {
		if err := pool.ValidateName("name", name); err != nil {
			return err
		}
	}
	if s.Cluster != nil {
		return s.findClusterSnapshots(w, r, match, name)
	}
	snaps := s.pool.FindSnapshots(match, name)
	seen := map[string]bool{}
	for _, v := range s.visible(r, match) {
		seen[v.Name] = true
	}
	out := api.List[api.Snapshot]{Items: make([]api.Snapshot, 0, len(snaps))}
	for _, sn := range snaps {
		if !seen[sn.Volume] {
			continue
		}
		out.Items = append(out.Items, viewOf(r).snapshot(snapshotToAPI(sn)))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	snaps := v.Snapshots()
	out := api.List[api.Snapshot]{Items: make([]api.Snapshot, 0, len(snaps))}
	for _, sn := range snaps {
		out.Items = append(out.Items, viewOf(r).snapshot(snapshotToAPI(sn)))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	var spec api.SnapshotSpec
	if err := decode(r, &spec); err != nil {
		return err
	}
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	idem, err := idempotency(r)
	if err != nil {
		return err
	}
	// A taken name is a 409 here, not a failed job.
	if err := v.CheckSnapshot(spec.Name, idem); err != nil {
		return err
	}
	// Take the volume before starting a job, so that a busy volume is a
	// 409, not a failed job. An existing snapshot needs no lock.
	create := v.CreateSnapshotWith
	release := func(bool) {}
	if _, err := v.Snapshot(spec.Name); err != nil {
		if release, err = s.reserveSnapshot(r.Context(), v); err != nil {
			return err
		}
	}
	rep, err := s.replicated(r, v.Name())
	if err != nil {
		release(false)
		return err
	}
	if rep {
		create = func(ctx context.Context, name string, idem pool.Idempotency, prog pool.Progress) (pool.SnapshotInfo, bool, error) {
			return s.Replicated.Snapshot(ctx, v.Name(), name, idem, prog)
		}
	} else if _, err := v.Snapshot(spec.Name); err != nil {
		h, err := v.Hold("snapshot")
		if err != nil {
			release(false)
			return err
		}
		create = h.CreateSnapshot
	}
	var info pool.SnapshotInfo
	created := false
	return s.runJob(w, r, "snapshot", v.Name()+"@"+spec.Name, 1, func(ctx context.Context, j *job.Job) error {
		var err error
		info, created, err = create(ctx, spec.Name, idem, j)
		release(err == nil && created)
		return err
	}, func() error {
		status := http.StatusOK
		if created {
			status = http.StatusCreated
		}
		writeJSON(w, status, viewOf(r).snapshot(snapshotToAPI(info)))
		return nil
	})
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) error {
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	sn, err := v.Snapshot(r.PathValue("snapshot"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, viewOf(r).snapshot(snapshotToAPI(sn)))
	return nil
}

// snapshotChanges answers what changed since a snapshot: up to another
// (?to=NAME) or the live disks.
func (s *Server) snapshotChanges(w http.ResponseWriter, r *http.Request) error {
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	from, to := r.PathValue("snapshot"), r.URL.Query().Get("to")
	ds, err := v.Changes(r.Context(), from, to)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, changesToAPI(v.Name(), from, to, ds))
	return nil
}

// snapshotAllocated answers the data ranges of one disk of a snapshot
// (api.SnapshotAllocated), at most ?limit= of them from ?offset= on.
func (s *Server) snapshotAllocated(w http.ResponseWriter, r *http.Request) error {
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	snap, q := r.PathValue("snapshot"), r.URL.Query()
	disk := q.Get("disk")
	if disk == "" {
		return &badRequest{field: "disk", msg: "disk is required: the name of a disk of the snapshot"}
	}
	off, limit := int64(0), api.MaxAllocatedRanges
	if o := q.Get("offset"); o != "" {
		n, err := strconv.ParseInt(o, 10, 64)
		if err != nil || n < 0 {
			return &badRequest{field: "offset", msg: fmt.Sprintf("offset %q: must be a byte offset (0 or more)", o)}
		}
		off = n
	}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > api.MaxAllocatedRanges {
			return &badRequest{field: "limit", msg: fmt.Sprintf("limit %q: must be 1 to %d", l, api.MaxAllocatedRanges)}
		}
		limit = n
	}
	d, err := v.OpenSnapshotDisk(snap, disk)
	if err != nil {
		return err
	}
	defer d.Close()
	size := d.Size()
	if off > size {
		return &badRequest{field: "offset", msg: fmt.Sprintf("offset %d: beyond the end of disk %s of %s@%s (%d bytes)",
			off, disk, v.Name(), snap, size)}
	}
	out := api.SnapshotAllocated{Volume: v.Name(), Snapshot: snap, Disk: disk, Size: size, Offset: off, Ranges: []api.Range{}}
	if off < size {
		// Holes and data alternate, so 2*limit extents hold at least
		// limit data runs when there are that many.
		ext, err := d.Extents(off, size-off, 2*limit)
		if err != nil {
			return fmt.Errorf("data ranges of disk %s of %s@%s: %w", disk, v.Name(), snap, err)
		}
		for _, e := range ext {
			if !e.Hole && len(out.Ranges) < limit {
				out.Ranges = append(out.Ranges, api.Range{Offset: e.Offset, Length: e.Length})
			}
		}
		if len(ext) == 2*limit || len(out.Ranges) == limit {
			// Possibly cut short: the rest from the end of the last range
			// returned.
			if k := len(out.Ranges) - 1; k >= 0 {
				if end := out.Ranges[k].Offset + out.Ranges[k].Length; end < size {
					out.Next = end
				}
			}
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) error {
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	rep, err := s.replicated(r, v.Name())
	if err != nil {
		return err
	}
	if rep {
		err = s.Replicated.DeleteSnapshot(r.Context(), v.Name(), r.PathValue("snapshot"))
	} else {
		err = v.DeleteSnapshot(r.Context(), r.PathValue("snapshot"))
	}
	if err != nil {
		return err
	}
	if v.Tenant() != "" {
		s.unchargeSnapshot(v.Name()) // counted in etcd when placed (reserveSnapshot)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// rekey rekeys an encrypted volume: shallow at once, deep as a job.
func (s *Server) rekey(w http.ResponseWriter, r *http.Request) error {
	var spec api.RekeySpec
	if err := decode(r, &spec); err != nil {
		return err
	}
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	o := pool.RekeyOptions{Deep: spec.Deep, Provider: spec.Provider, Rate: spec.Rate}
	if !spec.Deep {
		info, err := v.Rekey(r.Context(), o, nil)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, viewOf(r).volume(volumeToAPI(info)))
		return nil
	}
	var info pool.VolumeInfo
	return s.runJob(w, r, "rekey", v.Name(), 1, func(ctx context.Context, j *job.Job) error {
		var err error
		info, err = v.Rekey(ctx, o, j)
		return err
	}, func() error {
		writeJSON(w, http.StatusOK, viewOf(r).volume(volumeToAPI(info)))
		return nil
	})
}

func (s *Server) rollback(w http.ResponseWriter, r *http.Request) error {
	var spec api.RollbackSpec
	if err := decode(r, &spec); err != nil {
		return err
	}
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	if err := pool.ValidateName("snapshot", spec.Snapshot); err != nil {
		return err
	}
	if _, err := v.Snapshot(spec.Snapshot); err != nil {
		return err
	}
	force, err := boolQuery(r, api.QueryForce)
	if err != nil {
		return err
	}
	if !force { // connected writers are a 409 here, not a failed job
		if err := v.CheckWriters("rollback to " + spec.Snapshot); err != nil {
			return err
		}
	}
	rep, err := s.replicated(r, v.Name())
	if err != nil {
		return err
	}
	h, err := v.Hold("rollback") // a busy volume is a 409, not a failed job
	if err != nil {
		return err
	}
	var info pool.VolumeInfo
	return s.runJob(w, r, "rollback", v.Name()+"@"+spec.Snapshot, 1, func(ctx context.Context, j *job.Job) error {
		var err error
		if rep { // every copy at one cut
			info, err = s.Replicated.Rollback(ctx, h, v.Name(), spec.Snapshot, force, j)
		} else {
			info, err = h.Rollback(ctx, spec.Snapshot, force, j)
		}
		return err
	}, func() error {
		writeJSON(w, http.StatusOK, viewOf(r).volume(volumeToAPI(info)))
		return nil
	})
}

func (s *Server) clone(w http.ResponseWriter, r *http.Request) error {
	var spec api.CloneSpec
	if err := decode(r, &spec); err != nil {
		return err
	}
	idem, err := idempotency(r)
	if err != nil {
		return err
	}
	req := pool.CloneRequest{Source: pool.Source{Volume: spec.Source.Volume, Snapshot: spec.Source.Snapshot},
		Names: spec.Names, Labels: spec.Labels, Idempotency: idem}
	// The source in the caller's scope; the clones in the source's tenant.
	src, err := s.volumeOf(r, spec.Source.Volume)
	if err != nil && principalOf(r).Tenant != "" {
		return err
	}
	tenant := ""
	if src != nil {
		tenant = src.Tenant()
		req.Source.Volume = src.Name()
		req.Names = make([]string, len(spec.Names))
		for i, n := range spec.Names {
			if req.Names[i], err = poolName(auth.Principal{Tenant: principalOf(r).Tenant}, n); err != nil {
				return err
			}
		}
	}
	rep, err := s.replicatedClone(r, req.Source.Volume, tenant)
	if err != nil {
		return err
	}
	if err := s.checkOvercommit(s.cloneSize(req.Source) * int64(len(spec.Names))); err != nil {
		return err
	}
	release := func() {}
	if src != nil && tenant != "" {
		n := int64(len(req.Names))
		add := auth.Quota{Volumes: n, Capacity: n * s.cloneSize(req.Source), IOPS: auth.Unlimited}
		if rep {
			// Placed clones are counted in etcd as each is placed
			// (cloneCharge); past the quota now is a 403 here, not a
			// failed job.
			err = s.admitClusterClones(r.Context(), tenant, src, add)
		} else {
			release, err = s.reserve(tenant, add)
		}
		if err != nil {
			return err
		}
	}
	// Validate, look up the source and take it and the names before
	// starting a job, so that bad input, a missing source, a taken name or
	// a busy one is a 4xx, not a failed job.
	h, err := s.pool.HoldClone(req)
	if err != nil {
		release()
		return err
	}
	target := req.Source.String() + " -> " + summarize(spec.Names)
	var vols []pool.VolumeInfo
	return s.runJob(w, r, "clone", target, len(spec.Names), func(ctx context.Context, j *job.Job) error {
		defer release()
		var err error
		if rep { // on the source's nodes, every copy at one cut
			vols, err = s.Replicated.Clone(ctx, h, req, s.cloneCharge, j)
		} else {
			vols, err = h.Clone(ctx, j)
		}
		return err
	}, func() error {
		out := api.List[api.Volume]{Items: make([]api.Volume, 0, len(vols))}
		for _, v := range vols {
			out.Items = append(out.Items, volumeToAPI(v))
		}
		s.annotate(r, out.Items)
		for i := range out.Items {
			out.Items[i] = viewOf(r).volume(out.Items[i])
		}
		writeJSON(w, http.StatusCreated, out)
		return nil
	})
}

func summarize(names []string) string {
	if len(names) <= 3 {
		return strings.Join(names, ",")
	}
	return fmt.Sprintf("%s..%s (%d)", names[0], names[len(names)-1], len(names))
}

func (s *Server) listJobs(w http.ResponseWriter, r *http.Request) error {
	jobs := s.jobs.List()
	s.forgetJobs(jobs)
	out := api.List[api.Job]{Items: make([]api.Job, 0, len(jobs))}
	for _, j := range jobs {
		if !s.ownJob(r, j.ID) {
			continue
		}
		out.Items = append(out.Items, viewOf(r).job(jobToAPI(j)))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getJob(w http.ResponseWriter, r *http.Request) error {
	j, err := s.jobs.Get(r.PathValue("id"))
	if err == nil && !s.ownJob(r, r.PathValue("id")) {
		err = job.ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("job %q: %w", r.PathValue("id"), err)
	}
	writeJSON(w, http.StatusOK, viewOf(r).job(jobToAPI(j.Status())))
	return nil
}

func (s *Server) cancelJob(w http.ResponseWriter, r *http.Request) error {
	if !s.ownJob(r, r.PathValue("id")) {
		return fmt.Errorf("job %q: %w", r.PathValue("id"), job.ErrNotFound)
	}
	j, err := s.jobs.Cancel(r.PathValue("id"))
	if err != nil {
		return fmt.Errorf("job %q: %w", r.PathValue("id"), err)
	}
	writeJSON(w, http.StatusAccepted, viewOf(r).job(jobToAPI(j.Status())))
	return nil
}
