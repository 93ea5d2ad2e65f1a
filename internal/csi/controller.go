package csi

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/quantity"
)

// controller is the CSI controller service: volumes, snapshots, expansion,
// publication (attachments), capacity.
type controller struct {
	csi.UnimplementedControllerServer
	d *Driver
}

// controllerCaps are the controller capabilities quiver advertises;
// docs/csi.md lists those it does not, with the reason.
var controllerCaps = []csi.ControllerServiceCapability_RPC_Type{
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME,
	csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME,
	csi.ControllerServiceCapability_RPC_LIST_VOLUMES,
	csi.ControllerServiceCapability_RPC_GET_CAPACITY,
	csi.ControllerServiceCapability_RPC_CREATE_DELETE_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_LIST_SNAPSHOTS,
	csi.ControllerServiceCapability_RPC_GET_SNAPSHOT,
	csi.ControllerServiceCapability_RPC_CLONE_VOLUME,
	csi.ControllerServiceCapability_RPC_PUBLISH_READONLY,
	csi.ControllerServiceCapability_RPC_EXPAND_VOLUME,
	csi.ControllerServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
}

func (c *controller) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	caps := make([]*csi.ControllerServiceCapability, 0, len(controllerCaps))
	for _, t := range controllerCaps {
		caps = append(caps, &csi.ControllerServiceCapability{Type: &csi.ControllerServiceCapability_Rpc{
			Rpc: &csi.ControllerServiceCapability_RPC{Type: t},
		}})
	}
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: caps}, nil
}

// CreateVolume makes a quiver volume for a CSI name, or returns the one made
// for it before. The quiver name is volumeName(name); the CSI name is kept
// in LabelName, so a different CSI name or a volume made by hand under that
// quiver name is AlreadyExists, never adopted.
func (c *controller) CreateVolume(ctx context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	if err := checkName("name", req.GetName()); err != nil {
		return nil, err
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return nil, err
	}
	params, err := parseParams(req.GetParameters())
	if err != nil {
		return nil, err
	}
	qc, err := c.d.clientFor(req.GetSecrets())
	if err != nil {
		return nil, err
	}
	topo, err := c.checkTopology(ctx, qc, req.GetAccessibilityRequirements())
	if err != nil {
		return nil, err
	}
	maxName, err := c.d.maxVolumeName(ctx, qc)
	if err != nil {
		return nil, err
	}
	name := tenantVolumeName(req.GetName(), maxName)
	unlock, err := c.d.locks.tryLock(name)
	if err != nil {
		return nil, err
	}
	defer unlock()

	labels := maps.Clone(params.Labels)
	labels[LabelDriver] = c.d.cfg.DriverName
	labels[LabelName] = nameLabelValue(req.GetName())
	p := createPlan{name: name, csiName: req.GetName(), labels: labels, params: params, rng: req.GetCapacityRange()}

	var v api.Volume
	if src := req.GetVolumeContentSource(); src != nil {
		v, err = c.createFromSource(ctx, qc, p, src)
	} else {
		v, err = c.createEmpty(ctx, qc, p)
	}
	if err != nil {
		return nil, err
	}
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{
		VolumeId:           v.Name,
		CapacityBytes:      v.Capacity,
		VolumeContext:      volumeContext(v),
		ContentSource:      req.GetVolumeContentSource(),
		AccessibleTopology: []*csi.Topology{topo},
	}}, nil
}

// createPlan is what CreateVolume settled before it touches the server.
type createPlan struct {
	name, csiName string
	labels        map[string]string
	params        volumeParams
	rng           *csi.CapacityRange
}

func (c *controller) createEmpty(ctx context.Context, qc *client.Client, p createPlan) (api.Volume, error) {
	capacity, err := capacityFor(p.rng, sumSizes(p.params.Disks))
	if err != nil {
		return api.Volume{}, err
	}
	disks := p.params.Disks
	if disks == nil {
		disks = []api.DiskSpec{{Name: DefaultDisk, Size: capacity}}
	}
	if v, found, err := c.existing(ctx, qc, p, nil); err != nil || found {
		return v, err
	}
	v, err := qc.CreateVolume(ctx, api.VolumeSpec{Name: p.name, Capacity: capacity, Labels: p.labels, Disks: disks, QoS: p.params.QoS,
		Replicas: p.params.Replication, Encrypt: p.params.Encrypted != nil && *p.params.Encrypted},
		requestKey("volume", p.csiName))
	if err != nil {
		if client.IsConflict(err) {
			return v, fmt.Errorf("volume %q: quiver volume %s exists with another spec: %w", p.csiName, p.name, ErrExists)
		}
		if client.IsBusy(err) {
			return v, fmt.Errorf("create volume %s: %w (%v)", p.name, ErrBusy, err)
		}
		return v, fmt.Errorf("create volume %s: %w", p.name, err)
	}
	return v, nil
}

// existing returns the volume already made for the plan's CSI name, if any.
// A volume under that quiver name that was made for another CSI name (or by
// hand), of a capacity outside the range, or from another source is
// AlreadyExists.
func (c *controller) existing(ctx context.Context, qc *client.Client, p createPlan, src *api.Source) (api.Volume, bool, error) {
	v, err := qc.GetVolume(ctx, p.name)
	if client.IsNotFound(err) {
		return v, false, nil
	}
	if err != nil {
		return v, false, fmt.Errorf("look up volume %s: %w", p.name, err)
	}
	if v.Labels[LabelDriver] != c.d.cfg.DriverName || v.Labels[LabelName] != p.labels[LabelName] {
		return v, false, fmt.Errorf("volume %q: quiver volume %s exists and was not made for this CSI name (labels %s=%q, %s=%q): %w",
			p.csiName, p.name, LabelDriver, v.Labels[LabelDriver], LabelName, v.Labels[LabelName], ErrExists)
	}
	if req, limit := p.rng.GetRequiredBytes(), p.rng.GetLimitBytes(); v.Capacity < req || (limit > 0 && v.Capacity > limit) {
		return v, false, fmt.Errorf("volume %q exists with capacity %s, outside the range asked for (required %d, limit %d): %w",
			p.csiName, quantity.Format(v.Capacity), req, limit, ErrExists)
	}
	if src != nil && (v.Source == nil || *v.Source != *src) {
		return v, false, fmt.Errorf("volume %q exists with another content source: %w", p.csiName, ErrExists)
	}
	if src == nil && v.Source != nil {
		return v, false, fmt.Errorf("volume %q exists as a clone of %s, but no content source was asked for: %w", p.csiName, v.Source.Volume, ErrExists)
	}
	return v, true, nil
}

// createFromSource makes the volume as a quiver clone of a snapshot or of a
// live volume (through an implicit snapshot: every disk at one instant).
// The clone keeps the source's disk layout; it then grows to the capacity
// asked for and takes the StorageClass's QoS.
func (c *controller) createFromSource(ctx context.Context, qc *client.Client, p createPlan, src *csi.VolumeContentSource) (api.Volume, error) {
	var source api.Source
	var need int64
	switch s := src.GetType().(type) {
	case *csi.VolumeContentSource_Snapshot:
		vol, snap, err := parseSnapshotID("volume_content_source.snapshot.snapshot_id", s.Snapshot.GetSnapshotId())
		if err != nil {
			return api.Volume{}, err
		}
		sn, err := qc.GetSnapshot(ctx, vol, snap)
		if client.IsNotFound(err) {
			return api.Volume{}, fmt.Errorf("source snapshot %s: %w", s.Snapshot.GetSnapshotId(), ErrNotFound)
		} else if err != nil {
			return api.Volume{}, fmt.Errorf("source snapshot %s: %w", s.Snapshot.GetSnapshotId(), err)
		}
		source, need = api.Source{Volume: vol, Snapshot: snap}, sumDiskSizes(sn.Disks)
		sv, err := qc.GetVolume(ctx, vol)
		if err != nil {
			return api.Volume{}, fmt.Errorf("source volume %s: %w", vol, err)
		}
		if err := checkCloneEncryption(p.params, sv); err != nil {
			return api.Volume{}, err
		}
	case *csi.VolumeContentSource_Volume:
		vol, err := parseVolumeID("volume_content_source.volume.volume_id", s.Volume.GetVolumeId())
		if err != nil {
			return api.Volume{}, err
		}
		sv, err := qc.GetVolume(ctx, vol)
		if client.IsNotFound(err) {
			return api.Volume{}, fmt.Errorf("source volume %s: %w", vol, ErrNotFound)
		} else if err != nil {
			return api.Volume{}, fmt.Errorf("source volume %s: %w", vol, err)
		}
		source, need = api.Source{Volume: vol}, sv.Capacity
		if err := checkCloneEncryption(p.params, sv); err != nil {
			return api.Volume{}, err
		}
	default:
		return api.Volume{}, fmt.Errorf("volume_content_source: want a snapshot or a volume: %w", ErrInvalid)
	}
	capacity, err := capacityFor(p.rng, need)
	if err != nil {
		return api.Volume{}, err
	}
	v, found, err := c.existing(ctx, qc, p, &source)
	if err != nil {
		return v, err
	}
	if !found {
		made, err := qc.Clone(ctx, api.CloneSpec{Source: source, Names: []string{p.name}, Labels: p.labels},
			requestKey("volume", p.csiName))
		switch {
		case client.IsConflict(err):
			return v, fmt.Errorf("volume %q: quiver volume %s exists with another spec: %w", p.csiName, p.name, ErrExists)
		case client.IsNotFound(err):
			return v, fmt.Errorf("clone %s from %s: %w (%v)", p.name, sourceText(source), ErrNotFound, err)
		case client.IsBusy(err):
			return v, fmt.Errorf("clone %s from %s: %w (%v)", p.name, sourceText(source), ErrBusy, err)
		case err != nil:
			return v, fmt.Errorf("clone %s from %s: %w", p.name, sourceText(source), err)
		case len(made) != 1:
			return v, fmt.Errorf("clone %s from %s: the server returned %d volumes, want 1", p.name, sourceText(source), len(made))
		}
		v = made[0]
	}
	if limit := p.rng.GetLimitBytes(); limit > 0 && v.Capacity > limit {
		return v, fmt.Errorf("the clone of %s has capacity %s, above limit_bytes %d; ask for at least that much: %w",
			sourceText(source), quantity.Format(v.Capacity), limit, ErrOutOfRange)
	}
	if v, err = grow(ctx, qc, v, capacity); err != nil {
		return v, err
	}
	if p.params.QoS != nil && (v.QoS == nil || *v.QoS != *p.params.QoS) {
		if v, err = qc.UpdateVolume(ctx, v.Name, api.VolumeUpdate{QoS: p.params.QoS}); err != nil {
			return v, fmt.Errorf("set QoS of %s: %w", p.name, err)
		}
	}
	return v, nil
}

func sourceText(s api.Source) string {
	if s.Snapshot != "" {
		return snapshotID(s.Volume, s.Snapshot)
	}
	return s.Volume
}

// grow raises a volume's capacity to at least capacity and, when the volume
// holds only the default disk, grows that disk to fill it. Each step is
// skipped when already done, so a retried expansion finishes the work of
// an interrupted one.
func grow(ctx context.Context, qc *client.Client, v api.Volume, capacity int64) (api.Volume, error) {
	var err error
	if v.Capacity < capacity {
		if v, err = qc.UpdateVolume(ctx, v.Name, api.VolumeUpdate{Capacity: &capacity}); err != nil {
			return v, fmt.Errorf("grow volume %s to %s: %w", v.Name, quantity.Format(capacity), busyOr(err))
		}
	}
	if len(v.Disks) == 1 && v.Disks[0].Name == DefaultDisk && v.Disks[0].Size < v.Capacity {
		size := v.Capacity / sectorSize * sectorSize
		if v, err = qc.GrowDisk(ctx, v.Name, DefaultDisk, size); err != nil {
			return v, fmt.Errorf("grow disk %s/%s to %s: %w", v.Name, DefaultDisk, quantity.Format(size), busyOr(err))
		}
	}
	return v, nil
}

// busyOr marks the API's Busy answer as ErrBusy.
func busyOr(err error) error {
	if client.IsBusy(err) {
		return fmt.Errorf("%w (%v)", ErrBusy, err)
	}
	return err
}

// volumeContext is what a node is told about a volume at publish time.
func volumeContext(v api.Volume) map[string]string {
	names := make([]string, 0, len(v.Disks))
	for _, d := range v.Disks {
		names = append(names, d.Name)
	}
	ctx := map[string]string{"quiver.io/disks": strings.Join(names, ",")}
	if len(v.Disks) > 0 {
		ctx["quiver.io/primary-disk"] = v.Disks[0].Name
	}
	return ctx
}

// DeleteVolume deletes the volume with its disks. An unknown or malformed ID
// is success (it is gone). A volume this plugin did not make is refused, and
// so is one with snapshots: quiver keeps snapshots inside their volume, so
// they are not independent of it (the CSI spec's FAILED_PRECONDITION case).
func (c *controller) DeleteVolume(ctx context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	name, err := parseVolumeID("volume_id", req.GetVolumeId())
	if errors.Is(err, ErrNotFound) {
		return &csi.DeleteVolumeResponse{}, nil
	} else if err != nil {
		return nil, err
	}
	qc, unlock, err := c.d.lockedClient(req.GetSecrets(), name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	v, err := qc.GetVolume(ctx, name)
	if client.IsNotFound(err) {
		return &csi.DeleteVolumeResponse{}, nil
	} else if err != nil {
		return nil, fmt.Errorf("look up volume %s: %w", name, err)
	}
	if v.Labels[LabelDriver] != c.d.cfg.DriverName {
		return nil, fmt.Errorf("volume %s was not made by %s (no label %s=%s); delete it with `quiver volume delete` if that is meant: %w",
			name, c.d.cfg.DriverName, LabelDriver, c.d.cfg.DriverName, ErrPrecondition)
	}
	if v.Snapshots > 0 {
		return nil, fmt.Errorf("volume %s has %d snapshots, which quiver keeps inside the volume; delete them first: %w",
			name, v.Snapshots, ErrPrecondition)
	}
	// A pending delete (a copy's node is down) counts as done: the volume
	// is deleting, refused for any use, and its nodes finish the delete.
	_, err = qc.DeleteVolume(ctx, name)
	switch {
	case err == nil, client.IsNotFound(err):
		return &csi.DeleteVolumeResponse{}, nil
	case client.IsInUse(err):
		return nil, fmt.Errorf("volume %s is still attached: %w (%v)", name, ErrPrecondition, err)
	default:
		return nil, fmt.Errorf("delete volume %s: %w", name, busyOr(err))
	}
}

// ValidateVolumeCapabilities confirms the capabilities when quiver serves
// them all for the volume, and the parameters when they describe it.
func (c *controller) ValidateVolumeCapabilities(ctx context.Context, req *csi.ValidateVolumeCapabilitiesRequest) (*csi.ValidateVolumeCapabilitiesResponse, error) {
	name, err := parseVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if len(req.GetVolumeCapabilities()) == 0 {
		return nil, fmt.Errorf("volume_capabilities is required: %w", ErrInvalid)
	}
	qc, err := c.d.clientFor(req.GetSecrets())
	if err != nil {
		return nil, err
	}
	v, err := getVolume(ctx, qc, name)
	if err != nil {
		return nil, err
	}
	if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
		return &csi.ValidateVolumeCapabilitiesResponse{Message: err.Error()}, nil
	}
	if len(req.GetParameters()) > 0 {
		if msg := paramsMismatch(req.GetParameters(), v); msg != "" {
			return &csi.ValidateVolumeCapabilitiesResponse{Message: msg}, nil
		}
	}
	return &csi.ValidateVolumeCapabilitiesResponse{Confirmed: &csi.ValidateVolumeCapabilitiesResponse_Confirmed{
		VolumeContext:      req.GetVolumeContext(),
		VolumeCapabilities: req.GetVolumeCapabilities(),
		Parameters:         req.GetParameters(),
	}}, nil
}

// checkCloneEncryption refuses a clone whose StorageClass asks for an
// encryption its source does not have, or the other way round: a clone
// shares its source's blocks, so it is encrypted exactly when the source is.
func checkCloneEncryption(p volumeParams, src api.Volume) error {
	if p.Encrypted == nil || *p.Encrypted == (src.Encryption != nil) {
		return nil
	}
	state := "in the clear"
	if src.Encryption != nil {
		state = "encrypted"
	}
	return fmt.Errorf("parameter %s=%t: the source volume %s is %s, and a clone shares its source's blocks and encryption: %w",
		ParamEncrypted, *p.Encrypted, src.Name, state, ErrInvalid)
}

// paramsMismatch says how parameters differ from what the volume is, or "".
func paramsMismatch(params map[string]string, v api.Volume) string {
	p, err := parseParams(params)
	if err != nil {
		return err.Error()
	}
	if p.Disks != nil {
		var have []api.DiskSpec
		for _, d := range v.Disks {
			have = append(have, api.DiskSpec{Name: d.Name, Size: d.Size})
		}
		if !slices.Equal(have, p.Disks) {
			return fmt.Sprintf("parameter %s does not match the volume's disks", ParamDisks)
		}
	}
	if p.QoS != nil && (v.QoS == nil || *v.QoS != *p.QoS) {
		return "the QoS parameters do not match the volume's limits"
	}
	if r := p.Labels[LabelReplication]; r != "" && v.Labels[LabelReplication] != r {
		return fmt.Sprintf("parameter %s does not match the volume's", ParamReplication)
	}
	if p.Encrypted != nil && *p.Encrypted != (v.Encryption != nil) {
		return fmt.Sprintf("parameter %s does not match the volume's", ParamEncrypted)
	}
	return ""
}

// ListVolumes lists the volumes this plugin made, sorted by ID, a page at a
// time.
func (c *controller) ListVolumes(ctx context.Context, req *csi.ListVolumesRequest) (*csi.ListVolumesResponse, error) {
	if err := checkMaxEntries(req.GetMaxEntries()); err != nil {
		return nil, err
	}
	after, err := parseToken(req.GetStartingToken(), isDNSLabel)
	if err != nil {
		return nil, err
	}
	vols, err := c.d.ownVolumes(ctx, c.d.api)
	if err != nil {
		return nil, err
	}
	vols, next := page(vols, func(v api.Volume) string { return v.Name }, after, req.GetMaxEntries())
	resp := &csi.ListVolumesResponse{NextToken: next}
	for _, v := range vols {
		resp.Entries = append(resp.Entries, &csi.ListVolumesResponse_Entry{Volume: &csi.Volume{
			VolumeId: v.Name, CapacityBytes: v.Capacity, VolumeContext: volumeContext(v),
		}})
	}
	return resp, nil
}

// GetCapacity reports the pool's free bytes: quiver volumes are thin, so
// this is what new data can still take, not a sum of capacities.
func (c *controller) GetCapacity(ctx context.Context, req *csi.GetCapacityRequest) (*csi.GetCapacityResponse, error) {
	if len(req.GetVolumeCapabilities()) > 0 {
		if err := checkCapabilities(req.GetVolumeCapabilities()); err != nil {
			return &csi.GetCapacityResponse{}, nil
		}
	}
	if _, err := parseParams(req.GetParameters()); err != nil {
		return nil, err
	}
	info, err := c.d.api.Pool(ctx)
	if err != nil {
		return nil, fmt.Errorf("quiver pool: %w", err)
	}
	if seg := req.GetAccessibleTopology().GetSegments(); len(seg) > 0 && seg[TopologyPoolKey] != info.ID {
		return &csi.GetCapacityResponse{}, nil
	}
	return &csi.GetCapacityResponse{AvailableCapacity: info.FreeBytes}, nil
}

// ControllerExpandVolume grows the volume's capacity and, for the default
// single-disk layout, its disk. Neither Filesystem nor Block mode needs a
// node step: there is no filesystem to resize.
func (c *controller) ControllerExpandVolume(ctx context.Context, req *csi.ControllerExpandVolumeRequest) (*csi.ControllerExpandVolumeResponse, error) {
	if err := required("volume_id", req.GetVolumeId()); err != nil {
		return nil, err
	}
	if req.GetCapacityRange() == nil {
		return nil, fmt.Errorf("capacity_range is required: %w", ErrInvalid)
	}
	name, err := parseVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if req.GetVolumeCapability() != nil {
		if _, err := checkCapability(req.GetVolumeCapability()); err != nil {
			return nil, err
		}
	}
	qc, v, unlock, err := c.d.lockedVolume(ctx, req.GetSecrets(), name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	capacity, err := capacityFor(req.GetCapacityRange(), v.Capacity)
	if err != nil {
		return nil, err
	}
	if v, err = grow(ctx, qc, v, capacity); err != nil {
		return nil, err
	}
	return &csi.ControllerExpandVolumeResponse{CapacityBytes: v.Capacity, NodeExpansionRequired: false}, nil
}

// checkTopology checks accessibility requirements against the pool's
// segment and returns the segment.
func (c *controller) checkTopology(ctx context.Context, qc *client.Client, req *csi.TopologyRequirement) (*csi.Topology, error) {
	topo, err := c.d.topology(ctx, qc)
	if err != nil {
		return nil, err
	}
	requisite := req.GetRequisite()
	if len(requisite) == 0 {
		return topo, nil
	}
	for _, t := range requisite {
		if v, ok := t.GetSegments()[TopologyPoolKey]; ok && v == topo.Segments[TopologyPoolKey] {
			return topo, nil
		}
	}
	return nil, fmt.Errorf("accessibility_requirements: no requisite topology holds %s=%s, the pool this plugin serves: %w",
		TopologyPoolKey, topo.Segments[TopologyPoolKey], ErrNoSpace)
}
