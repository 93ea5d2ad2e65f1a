package csi

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	mount "k8s.io/mount-utils"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/blockdev"
	"github.com/quiverstorage/quiver/internal/endpoint"
)

// nodeService is the CSI node service. NodeStageVolume does the per-node
// work once per volume (a bind mount of the volume directory, or the NBD
// block device); NodePublishVolume bind-mounts the staged volume at each
// target. Every step is recorded in the state directory, so unstaging
// undoes exactly what staging did, also after a plugin restart.
type nodeService struct {
	csi.UnimplementedNodeServer
	d       *Driver
	state   *stateStore
	mounter mount.Interface
	block   blockdev.Devices
	// ep is the node's endpoint (Config.QuiverEndpoint), nil without one.
	ep *endpoint.Client
}

func newNodeService(d *Driver) (*nodeService, error) {
	st, err := newStateStore(d.cfg.StateDir)
	if err != nil {
		return nil, err
	}
	m := mount.New("")
	var block blockdev.Devices = blockdev.NewNbdfuseLoop(m)
	if d.cfg.DeviceAgent != "" {
		block = blockdev.NewClient(d.cfg.DeviceAgent)
	}
	var ep *endpoint.Client
	if d.cfg.QuiverEndpoint != "" {
		ep = endpoint.NewClient(d.cfg.QuiverEndpoint)
		block = ep // the endpoint holds the devices, on its own sockets
	}
	return &nodeService{d: d, state: st, mounter: m, block: block, ep: ep}, nil
}

func (n *nodeService) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	var caps []*csi.NodeServiceCapability
	for _, t := range []csi.NodeServiceCapability_RPC_Type{
		csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csi.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csi.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	} {
		caps = append(caps, &csi.NodeServiceCapability{Type: &csi.NodeServiceCapability_Rpc{
			Rpc: &csi.NodeServiceCapability_RPC{Type: t},
		}})
	}
	return &csi.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

// NodeGetInfo reports the node ID and the pool segment: every node whose
// plugin reaches the same quiver pool can use its volumes.
func (n *nodeService) NodeGetInfo(ctx context.Context, _ *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	topo, err := n.d.topology(ctx, n.d.api)
	if err != nil {
		return nil, err
	}
	return &csi.NodeGetInfoResponse{NodeId: n.d.cfg.NodeID, AccessibleTopology: topo}, nil
}

// NodeStageVolume prepares a volume on this node: Filesystem mode binds the
// volume's directory at the staging path; Block mode connects the primary
// disk over NBD (with the attachment token of publish_context) and makes a
// loop device of it.
func (n *nodeService) NodeStageVolume(ctx context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	staging := req.GetStagingTargetPath()
	if err := required("volume_id", req.GetVolumeId(), "staging_target_path", staging); err != nil {
		return nil, err
	}
	kind, err := checkCapability(req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	name, err := parseVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	_, v, unlock, err := n.d.lockedVolume(ctx, req.GetSecrets(), name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	readOnly := readOnlyMode(req.GetVolumeCapability().GetAccessMode().GetMode())
	rec, err := n.state.load(name)
	if err != nil {
		return nil, err
	}
	if rec != nil {
		switch {
		case rec.Staging != staging:
			return nil, fmt.Errorf("volume %s is already staged on this node at %s: %w", name, rec.Staging, ErrPrecondition)
		case rec.Kind != kind.String() || rec.ReadOnly != readOnly:
			return nil, fmt.Errorf("volume %s is already staged at %s as %s (read-only %v): %w",
				name, staging, rec.Kind, rec.ReadOnly, ErrExists)
		}
		whole, err := n.stagedWhole(ctx, rec)
		if err != nil {
			return nil, fmt.Errorf("volume %s: check its staging: %w", name, err)
		}
		if whole {
			return &csi.NodeStageVolumeResponse{}, nil
		}
		// A staging left half-done (a crash, a restarted plugin that took
		// nbdfuse with it): undo what is left and stage again.
		n.d.log.Info("restaging volume", "volume", name, "kind", rec.Kind)
		if err := n.unstage(ctx, rec); err != nil {
			return nil, err
		}
	}
	rec = &stageRecord{Volume: name, Kind: kind.String(), Staging: staging, ReadOnly: readOnly}
	if kind == kindBlock {
		err = n.stageBlock(ctx, rec, v, req.GetVolumeContext(), req.GetPublishContext())
	} else {
		err = n.stageFilesystem(ctx, rec, v, req.GetPublishContext())
	}
	if err != nil {
		return nil, err
	}
	return &csi.NodeStageVolumeResponse{}, nil
}

// stagedWhole reports whether every step of a recorded staging is in place.
func (n *nodeService) stagedWhole(ctx context.Context, rec *stageRecord) (bool, error) {
	if rec.Kind == kindBlock.String() {
		return n.block.Healthy(ctx, rec.FuseDir, rec.Disk, rec.Loop, rec.PID)
	}
	mounted, err := n.mounter.IsMountPoint(rec.Staging)
	return err == nil && mounted, nil
}

func (n *nodeService) stageFilesystem(ctx context.Context, rec *stageRecord, v api.Volume, pubCtx map[string]string) error {
	if v.Encryption != nil {
		// The image files hold ciphertext: only quiver's data path
		// decrypts, so a VM given the files would see noise.
		return fmt.Errorf("volume %s is encrypted (key provider %s): its image files hold ciphertext that only quiver's NBD path "+
			"decrypts, so Filesystem mode cannot serve it; use volumeMode: Block: %w", v.Name, v.Encryption.Provider, ErrPrecondition)
	}
	if onCluster(v) {
		// A copy's directory is one node's files: a VM writing there
		// would bypass synchronous replication and the single-writer
		// fencing, and another node would see other files, or none.
		if n.ep == nil {
			return fmt.Errorf("volume %s is kept by a cluster (%d copies, primary %s): Filesystem mode would expose one copy's files "+
				"and bypass replication and fencing, so this plugin needs the node's endpoint: run `quiver endpoint` on this node and "+
				"start the plugin with --quiver-endpoint, or use volumeMode: Block: %w",
				v.Name, len(v.Copies), v.Primary, ErrPrecondition)
		}
		pub, err := n.publishEndpoint(ctx, rec, v, pubCtx)
		if err != nil {
			return err
		}
		return n.bindStaging(rec, pub.Dir)
	}
	src, err := n.localPath(ctx, v.Path)
	if err != nil {
		return err
	}
	if fi, err := os.Stat(src); err != nil || !fi.IsDir() {
		return fmt.Errorf("volume %s: this node does not see its directory %s (Filesystem mode needs the pool on every node: "+
			"a local pool on this node or an NFS pool mounted everywhere, see --pool-dir; or use volumeMode: Block): %w",
			v.Name, src, ErrPrecondition)
	}
	if !rec.ReadOnly {
		// The VM will write the files themselves, where quiver's change
		// tracking cannot see it: say so on the volume first.
		if err := n.d.api.SetDirectAccess(ctx, v.Name, n.d.cfg.NodeID, true); err != nil {
			return fmt.Errorf("volume %s: record direct access: %w", v.Name, err)
		}
		rec.Direct = true
	}
	return n.bindStaging(rec, src)
}

// bindStaging binds src at the staging path, recorded first.
func (n *nodeService) bindStaging(rec *stageRecord, src string) error {
	if err := os.MkdirAll(rec.Staging, 0o750); err != nil {
		return fmt.Errorf("staging path: %w", err)
	}
	rec.Source = src
	if err := n.state.save(rec); err != nil {
		return err
	}
	if err := n.mounter.Mount(src, rec.Staging, "", []string{"bind"}); err != nil {
		return fmt.Errorf("bind %s at %s: %w", src, rec.Staging, err)
	}
	return nil
}

// onCluster reports whether a volume is kept by a cluster's nodes.
func onCluster(v api.Volume) bool { return v.Primary != "" || len(v.Copies) > 0 }

// publishEndpoint publishes every disk of v at the node's endpoint with the
// attachment of publish_context, recorded first (a crash leaves a record
// that the next stage or unstage undoes).
func (n *nodeService) publishEndpoint(ctx context.Context, rec *stageRecord, v api.Volume, pubCtx map[string]string) (endpoint.Published, error) {
	token := pubCtx[PublishToken]
	if token == "" {
		return endpoint.Published{}, fmt.Errorf("volume %s: publish_context has no attachment token (%s): the endpoint needs the node's attachment: %w",
			v.Name, PublishToken, ErrPrecondition)
	}
	pv := endpoint.Volume{Name: v.Name, Export: pubCtx[PublishExportVolume], Token: token}
	for _, d := range v.Disks {
		pv.Disks = append(pv.Disks, endpoint.Disk{Name: d.Name, Size: d.Size})
	}
	rec.Endpoint, rec.Attachment = true, pubCtx[PublishAttachment]
	if err := n.state.save(rec); err != nil {
		return endpoint.Published{}, err
	}
	pub, err := n.ep.Publish(ctx, pv)
	if err != nil {
		return endpoint.Published{}, fmt.Errorf("volume %s: publish at the node's endpoint: %w", v.Name, err)
	}
	n.d.log.Info("published at the endpoint", "volume", v.Name, "dir", pub.Dir)
	return pub, nil
}

func (n *nodeService) stageBlock(ctx context.Context, rec *stageRecord, v api.Volume, volCtx, pubCtx map[string]string) error {
	disk, err := primaryDisk(v, volCtx)
	if err != nil {
		return err
	}
	export := v.Name + "/" + disk
	if ev := pubCtx[PublishExportVolume]; ev != "" {
		export = ev + "/" + disk
	}
	if token := pubCtx[PublishToken]; token != "" {
		export += "/" + token
	}
	if n.ep != nil {
		// Every disk, as one device: the KubeVirt hook gives QEMU each
		// disk as a slice of it (endpoint.SlotSize apart).
		disk = endpoint.DisksExport
	}
	if err := os.MkdirAll(rec.Staging, 0o750); err != nil {
		return fmt.Errorf("staging path: %w", err)
	}
	rec.Disk, rec.Attachment = disk, pubCtx[PublishAttachment]
	rec.FuseDir = filepath.Join(n.state.fuseRoot(), v.Name)
	var uri string
	if n.ep != nil {
		// publishEndpoint records the intent first.
		pub, err := n.publishEndpoint(ctx, rec, v, pubCtx)
		if err != nil {
			return err
		}
		uri = (&url.URL{Scheme: "nbd+unix", Path: "/" + disk, RawQuery: url.Values{"socket": {pub.Socket}}.Encode()}).String()
	} else {
		if uri, err = nbdURI(n.d.cfg.NBD, export); err != nil {
			return fmt.Errorf("%w: %w", err, ErrPrecondition)
		}
		// Record the intent first: a crash during attach leaves a
		// record that the next stage or unstage cleans up.
		if err := n.state.save(rec); err != nil {
			return err
		}
	}
	loop, pid, err := n.block.Attach(ctx, rec.FuseDir, disk, uri, rec.ReadOnly)
	if err != nil {
		if rec.Endpoint {
			_ = n.ep.Unpublish(ctx, v.Name)
		}
		_ = n.state.remove(v.Name)
		if errors.Is(err, blockdev.ErrNoTool) {
			return fmt.Errorf("volume %s: %w: %w", v.Name, err, ErrPrecondition)
		}
		return fmt.Errorf("volume %s: NBD export %s/%s as a block device: %w", v.Name, v.Name, disk, err)
	}
	rec.Loop, rec.PID = loop, pid
	n.d.log.Info("staged block volume", "volume", v.Name, "disk", disk, "loop", loop, "pid", pid)
	return n.state.save(rec)
}

// primaryDisk is the disk Block mode exposes: the one the volume context
// names, else the volume's first disk.
func primaryDisk(v api.Volume, volCtx map[string]string) (string, error) {
	if len(v.Disks) == 0 {
		return "", fmt.Errorf("volume %s has no disk to expose as a block device: %w", v.Name, ErrPrecondition)
	}
	if want := volCtx["quiver.io/primary-disk"]; want != "" {
		if slices.ContainsFunc(v.Disks, func(d api.Disk) bool { return d.Name == want }) {
			return want, nil
		}
	}
	return v.Disks[0].Name, nil
}

// NodeUnstageVolume undoes NodeStageVolume. A volume not staged here is
// success.
func (n *nodeService) NodeUnstageVolume(ctx context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	if err := required("volume_id", req.GetVolumeId(), "staging_target_path", req.GetStagingTargetPath()); err != nil {
		return nil, err
	}
	name, err := parseVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return &csi.NodeUnstageVolumeResponse{}, nil
	}
	rec, unlock, err := n.lockedRecord(name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if rec == nil || rec.Staging != req.GetStagingTargetPath() {
		return &csi.NodeUnstageVolumeResponse{}, nil
	}
	if len(rec.Targets) > 0 {
		return nil, fmt.Errorf("volume %s is still published at %s; unpublish it first: %w", name, rec.Targets[0].Path, ErrPrecondition)
	}
	if err := n.unstage(ctx, rec); err != nil {
		return nil, err
	}
	return &csi.NodeUnstageVolumeResponse{}, nil
}

// lockedRecord takes the lock of volume and loads its record (nil when it
// is not staged here); call the returned function to release the lock.
func (n *nodeService) lockedRecord(volume string) (*stageRecord, func(), error) {
	unlock, err := n.d.locks.tryLock(volume)
	if err != nil {
		return nil, nil, err
	}
	rec, err := n.state.load(volume)
	if err != nil {
		unlock()
		return nil, nil, err
	}
	return rec, unlock, nil
}

// unstage undoes every step of rec that is in place, then forgets rec.
func (n *nodeService) unstage(ctx context.Context, rec *stageRecord) error {
	if rec.Kind == kindBlock.String() {
		if err := n.block.Detach(ctx, rec.FuseDir, rec.Disk, rec.Loop, rec.PID); err != nil {
			return fmt.Errorf("volume %s: %w", rec.Volume, err)
		}
		n.d.log.Info("unstaged block volume", "volume", rec.Volume, "loop", rec.Loop)
	} else if err := n.unmount(rec.Staging, false); err != nil {
		return err
	}
	if rec.Direct {
		if err := n.d.api.SetDirectAccess(ctx, rec.Volume, n.d.cfg.NodeID, false); err != nil {
			return fmt.Errorf("volume %s: clear direct access: %w", rec.Volume, err)
		}
	}
	if rec.Endpoint {
		if n.ep == nil {
			return fmt.Errorf("volume %s was published at the node's endpoint, and this plugin has none (--quiver-endpoint): %w", rec.Volume, ErrPrecondition)
		}
		if err := n.ep.Unpublish(ctx, rec.Volume); err != nil {
			return fmt.Errorf("volume %s: %w", rec.Volume, err)
		}
	}
	return n.state.remove(rec.Volume)
}

// NodePublishVolume bind-mounts the staged volume at the target path: the
// volume's directory (Filesystem mode) or the loop device (Block mode).
func (n *nodeService) NodePublishVolume(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	target := req.GetTargetPath()
	if err := required("volume_id", req.GetVolumeId(), "target_path", target); err != nil {
		return nil, err
	}
	kind, err := checkCapability(req.GetVolumeCapability())
	if err != nil {
		return nil, err
	}
	if req.GetStagingTargetPath() == "" {
		return nil, fmt.Errorf("staging_target_path is required (the plugin stages volumes): %w", ErrPrecondition)
	}
	name, err := parseVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	rec, unlock, err := n.lockedRecord(name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if rec == nil || rec.Staging != req.GetStagingTargetPath() {
		return nil, fmt.Errorf("volume %s is not staged at %s: %w", name, req.GetStagingTargetPath(), ErrPrecondition)
	}
	if rec.Kind != kind.String() {
		return nil, fmt.Errorf("volume %s is staged as %s, not %s: %w", name, rec.Kind, kind, ErrExists)
	}
	mode := req.GetVolumeCapability().GetAccessMode().GetMode()
	pub := publication{Path: target, ReadOnly: req.GetReadonly() || readOnlyMode(mode), AccessMode: mode.String()}
	if have, ok := rec.target(target); ok {
		if have != pub {
			return nil, fmt.Errorf("volume %s is already published at %s with other attributes: %w", name, target, ErrExists)
		}
		if mounted, err := n.mounter.IsMountPoint(target); err == nil && mounted {
			return &csi.NodePublishVolumeResponse{}, nil
		}
		rec.removeTarget(target)
	}
	single := csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER.String()
	for _, other := range rec.Targets {
		if other.AccessMode == single || pub.AccessMode == single {
			return nil, fmt.Errorf("volume %s is published at %s and one of the two publications is %s: %w",
				name, other.Path, single, ErrPrecondition)
		}
	}
	if err := n.publish(rec, pub, req.GetVolumeCapability().GetMount().GetMountFlags()); err != nil {
		return nil, err
	}
	rec.Targets = append(rec.Targets, pub)
	if err := n.state.save(rec); err != nil {
		return nil, err
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

func (n *nodeService) publish(rec *stageRecord, pub publication, flags []string) error {
	source := rec.Staging
	if rec.Kind == kindBlock.String() {
		source = rec.Loop
		if err := os.MkdirAll(filepath.Dir(pub.Path), 0o750); err != nil {
			return fmt.Errorf("target path: %w", err)
		}
		f, err := os.OpenFile(pub.Path, os.O_CREATE|os.O_RDONLY, 0o640)
		if err != nil {
			return fmt.Errorf("target path: %w", err)
		}
		f.Close()
	} else if err := os.MkdirAll(pub.Path, 0o750); err != nil {
		return fmt.Errorf("target path: %w", err)
	}
	opts := append([]string{"bind"}, flags...)
	if pub.ReadOnly {
		opts = append(opts, "ro")
	}
	if err := n.mounter.Mount(source, pub.Path, "", opts); err != nil {
		return fmt.Errorf("bind %s at %s: %w", source, pub.Path, err)
	}
	return nil
}

// NodeUnpublishVolume unmounts the target path and removes it. A target
// that is not there is success.
func (n *nodeService) NodeUnpublishVolume(ctx context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	target := req.GetTargetPath()
	if err := required("volume_id", req.GetVolumeId(), "target_path", target); err != nil {
		return nil, err
	}
	name, err := parseVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	rec, unlock, err := n.lockedRecord(name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if rec == nil {
		return &csi.NodeUnpublishVolumeResponse{}, nil
	}
	if _, ok := rec.target(target); !ok {
		return &csi.NodeUnpublishVolumeResponse{}, nil
	}
	if err := n.unmount(target, true); err != nil {
		return nil, err
	}
	rec.removeTarget(target)
	if err := n.state.save(rec); err != nil {
		return nil, err
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// unmount unmounts path if it is a mount point and, when remove is set,
// removes it (a directory or the file a block device was bound on).
func (n *nodeService) unmount(path string, remove bool) error {
	mounted, err := n.mounter.IsMountPoint(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("check %s: %w", path, err)
	}
	if mounted {
		if err := n.mounter.Unmount(path); err != nil {
			return fmt.Errorf("unmount %s: %w", path, err)
		}
	}
	if remove {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", path, err)
		}
	}
	return nil
}

// NodeGetVolumeStats reports a published volume's usage in bytes: for
// Filesystem mode its capacity and the space all its disks take on the pool,
// for Block mode the primary disk's size and allocation.
func (n *nodeService) NodeGetVolumeStats(ctx context.Context, req *csi.NodeGetVolumeStatsRequest) (*csi.NodeGetVolumeStatsResponse, error) {
	if err := required("volume_id", req.GetVolumeId(), "volume_path", req.GetVolumePath()); err != nil {
		return nil, err
	}
	name, err := parseVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	v, err := getVolume(ctx, n.d.api, name)
	if err != nil {
		return nil, err
	}
	rec, err := n.state.load(name)
	if err != nil {
		return nil, err
	}
	path := filepath.Clean(req.GetVolumePath())
	if rec == nil {
		return nil, fmt.Errorf("volume %s is not staged on this node: %w", name, ErrNotFound)
	}
	if _, ok := rec.target(path); !ok && path != filepath.Clean(rec.Staging) {
		return nil, fmt.Errorf("volume %s is not published at %s: %w", name, req.GetVolumePath(), ErrNotFound)
	}
	total, used := v.Capacity, int64(0)
	for _, d := range v.Disks {
		if rec.Kind == kindBlock.String() && d.Name != rec.Disk && rec.Disk != endpoint.DisksExport {
			continue
		}
		used += d.Allocated
		if rec.Kind == kindBlock.String() && rec.Disk != endpoint.DisksExport {
			total = d.Size
		}
	}
	return &csi.NodeGetVolumeStatsResponse{Usage: []*csi.VolumeUsage{{
		Unit: csi.VolumeUsage_BYTES, Total: total, Used: used, Available: max(total-used, 0),
	}}}, nil
}

// localPath maps a path the server reports to where this node sees it.
func (n *nodeService) localPath(ctx context.Context, serverPath string) (string, error) {
	if n.d.cfg.PoolDir == "" {
		return serverPath, nil
	}
	info, err := n.d.poolInfo(ctx, n.d.api)
	if err != nil {
		return "", err
	}
	rel, err := filepath.Rel(info.Path, serverPath)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("volume path %s is not inside the pool %s", serverPath, info.Path)
	}
	return filepath.Join(n.d.cfg.PoolDir, rel), nil
}

// nbdURI is the NBD URI of an export on the server at addr: host:port, or
// unix:///path/to.sock. The export name is escaped as a URI path.
func nbdURI(addr, export string) (string, error) {
	path := (&url.URL{Path: "/" + export}).EscapedPath()
	if sock, ok := strings.CutPrefix(addr, "unix://"); ok {
		if !strings.HasPrefix(sock, "/") {
			return "", fmt.Errorf("NBD address %q: want unix:///absolute/path", addr)
		}
		return "nbd+unix://" + path + "?socket=" + url.QueryEscape(sock), nil
	}
	if addr == "" || strings.Contains(addr, "/") {
		return "", fmt.Errorf("NBD address %q: want host:port or unix:///path/to.sock (--nbd)", addr)
	}
	return "nbd://" + addr + path, nil
}
