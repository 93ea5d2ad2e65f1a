package apiserver

import (
	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/job"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/qos"
)

func volumeToAPI(v pool.VolumeInfo) api.Volume {
	if v.Broken != "" {
		return api.Volume{Name: v.Name, Disks: []api.Disk{}, State: api.VolumeBroken, Reason: v.Broken}
	}
	out := api.Volume{Name: v.Name, Tenant: v.Tenant, UID: v.UID, Capacity: v.Capacity, Labels: v.Labels, Disks: disksToAPI(v.Disks),
		Snapshots: v.Snapshots, CreatedAt: v.CreatedAt, Path: v.Dir, Replicas: v.Replicas,
		Writer: api.Writer{Epoch: v.Writer.Epoch, Attachment: v.Writer.Writer}}
	if v.Source != nil {
		out.Source = &api.Source{Volume: v.Source.Volume, Snapshot: v.Source.Snapshot}
	}
	if !v.QoS.Unlimited() {
		q := api.QoS(v.QoS)
		out.QoS = &q
	}
	out.DirectAccess = v.DirectAccess
	if e := v.Encryption; e != nil {
		out.Encryption = &api.Encryption{Provider: e.Provider, KeyID: e.KeyID}
		if rk := e.Rekey; rk != nil {
			out.Encryption.Rekey = &api.RekeyProgress{Started: rk.StartedAt, DoneBytes: rk.Done, TotalBytes: rk.Total, Running: rk.Running}
		}
	}
	if f := v.Fill; f != nil {
		out.Restore = &api.RestoreProgress{Source: f.Source, Started: f.Started, CopiedBytes: f.FilledBytes, TotalBytes: f.TotalBytes}
	}
	if p := v.BackupPolicy; p != nil {
		out.BackupPolicy = &api.BackupPolicy{Every: p.Every.String(), Target: p.Target, KeepLast: p.KeepLast,
			KeepDaily: p.KeepDaily, KeepWeekly: p.KeepWeekly, KeepMonthly: p.KeepMonthly}
	}
	if p := v.DRPolicy; p != nil {
		out.DRPolicy = &api.DRPolicy{Site: p.Site, Relationship: p.Relationship, RPO: p.RPO.String()}
	}
	return out
}

func disksToAPI(ds []pool.DiskInfo) []api.Disk {
	out := make([]api.Disk, 0, len(ds))
	for _, d := range ds {
		out = append(out, api.Disk{Name: d.Name, Size: d.Size, Allocated: d.Allocated, Path: d.Path, Shared: d.Shared})
	}
	return out
}

func snapshotToAPI(s pool.SnapshotInfo) api.Snapshot {
	return api.Snapshot{Name: s.Name, UID: s.UID, Volume: s.Volume, Disks: disksToAPI(s.Disks), Method: s.Method,
		CreatedAt: s.CreatedAt, GateHeld: s.GateHeld}
}

func changesToAPI(volume, from, to string, ds []pool.DiskDelta) api.SnapshotChanges {
	out := api.SnapshotChanges{Volume: volume, From: from, To: to, Disks: make([]api.DiskChanges, 0, len(ds))}
	for _, d := range ds {
		rs := make([]api.Range, 0, len(d.Ranges))
		for _, r := range d.Ranges {
			rs = append(rs, api.Range{Offset: r.Offset, Length: r.Length})
		}
		out.Disks = append(out.Disks, api.DiskChanges{Disk: d.Disk, Size: d.Size, BaseSize: d.BaseSize, Whole: d.Whole,
			Changed: d.Changed, Ranges: rs})
	}
	return out
}

func jobToAPI(s job.Status) api.Job {
	out := api.Job{ID: s.ID, Kind: s.Kind, Target: s.Target, State: s.State, BytesDone: s.BytesDone,
		BytesTotal: s.BytesTotal, ItemsDone: s.ItemsDone, ItemsTotal: s.ItemsTotal, Result: s.Result,
		StartedAt: s.StartedAt, EndedAt: s.EndedAt}
	if s.Err != nil {
		_, e := toError(s.Err)
		out.Error = &e
	}
	return out
}

func diskSpecsFromAPI(ds []api.DiskSpec) []pool.DiskSpec {
	if ds == nil {
		return nil
	}
	out := make([]pool.DiskSpec, len(ds))
	for i, d := range ds {
		out[i] = pool.DiskSpec{Name: d.Name, Size: d.Size, Shared: d.Shared}
	}
	return out
}

func qosFromAPI(q *api.QoS) qos.Limits {
	if q == nil {
		return qos.Limits{}
	}
	return qos.Limits(*q)
}

// updateFromAPI is the pool's update of a PATCH /v1/volumes/{volume}.
func updateFromAPI(u api.VolumeUpdate) pool.Update {
	upd := pool.Update{Capacity: u.Capacity, Labels: u.Labels}
	if u.QoS != nil {
		q := qosFromAPI(u.QoS)
		upd.QoS = &q
	}
	return upd
}

func attachmentToAPI(a pool.AttachmentInfo) api.Attachment {
	return api.Attachment{ID: a.ID, Volume: a.Volume, Node: a.Node, Mode: a.Mode, Token: a.Token, Implicit: a.Implicit,
		Writer: a.Writer, Fenced: a.Fenced, State: a.State, Conns: a.Conns, CreatedAt: a.CreatedAt}
}
