package csi

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

// Keys of the publish_context ControllerPublishVolume returns and the node
// reads: the quiver attachment made for the node and its NBD token.
const (
	PublishAttachment = "quiver.io/attachment"
	PublishToken      = "quiver.io/token"
	// PublishExportVolume is the volume's name in its NBD export names, as
	// the attachment's URIs give it: the pool's name, which on a cluster
	// node is what an attachment token opens, and which for a tenant's
	// volume is not the name the plugin knows it by (docs/csi.md). Absent
	// (a publication made before it existed), the node uses the volume ID.
	PublishExportVolume = "quiver.io/export-volume"
)

// ControllerPublishVolume attaches the volume (every disk, as one unit) for
// the node: a quiver attachment, rw or ro, whose token the node presents in
// the NBD export name. Attachments are what let quiver enforce one writer
// per volume during live migration. Publishing again to the same node with
// the same mode returns the same attachment; with the other mode it is
// AlreadyExists.
func (c *controller) ControllerPublishVolume(ctx context.Context, req *csi.ControllerPublishVolumeRequest) (*csi.ControllerPublishVolumeResponse, error) {
	if err := required("volume_id", req.GetVolumeId(), "node_id", req.GetNodeId()); err != nil {
		return nil, err
	}
	if _, err := checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, err
	}
	name, err := parseVolumeID("volume_id", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	qc, _, unlock, err := c.d.lockedVolume(ctx, req.GetSecrets(), name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if !c.d.knownNode.exists(req.GetNodeId()) {
		return nil, fmt.Errorf("node %q: no quiver node plugin reported this node ID: %w", req.GetNodeId(), ErrNotFound)
	}
	mode := api.ModeReadWrite
	if req.GetReadonly() || readOnlyMode(req.GetVolumeCapability().GetAccessMode().GetMode()) {
		mode = api.ModeReadOnly
	}
	// The node's attachment of the same mode is the answer whatever made
	// it (IdempotentCreate): CSI's own rule for a repeated publish, and it
	// keeps publications made before requests carried keys.
	a, err := qc.Attach(ctx, name, api.AttachmentSpec{Node: req.GetNodeId(), Mode: mode},
		requestKey("publish", name, req.GetNodeId()), client.IdempotentCreate())
	switch {
	case client.IsConflict(err):
		return nil, fmt.Errorf("volume %s is already published to node %s with another mode than %s: %w (%v)",
			name, req.GetNodeId(), mode, ErrExists, err)
	case client.IsNotFound(err):
		return nil, fmt.Errorf("attach volume %s: %w (%v)", name, ErrNotFound, err)
	case err != nil:
		return nil, fmt.Errorf("attach volume %s for node %s: %w", name, req.GetNodeId(), busyOr(err))
	}
	pc := map[string]string{PublishAttachment: a.ID, PublishToken: a.Token}
	if ev := exportVolume(a.URIs); ev != "" {
		pc[PublishExportVolume] = ev
	}
	return &csi.ControllerPublishVolumeResponse{PublishContext: pc}, nil
}

// exportVolume returns the volume part of the NBD URIs of an attachment
// (nbd://host:port/<volume>/<disk>/<token>, nbd+unix:///<volume>/...), ""
// when they give none.
func exportVolume(uris map[string]string) string {
	for _, disk := range slices.Sorted(maps.Keys(uris)) {
		u, err := url.Parse(uris[disk])
		if err != nil {
			continue
		}
		if v, _, ok := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/"); ok && v != "" {
			return v
		}
	}
	return ""
}

// ControllerUnpublishVolume deletes the node's attachments of the volume
// (every node's when node_id is empty): their NBD connections are closed and
// their tokens refused. A volume or attachment that is already gone is
// success.
func (c *controller) ControllerUnpublishVolume(ctx context.Context, req *csi.ControllerUnpublishVolumeRequest) (*csi.ControllerUnpublishVolumeResponse, error) {
	name, err := parseVolumeID("volume_id", req.GetVolumeId())
	if errors.Is(err, ErrNotFound) {
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	} else if err != nil {
		return nil, err
	}
	qc, unlock, err := c.d.lockedClient(req.GetSecrets(), name)
	if err != nil {
		return nil, err
	}
	defer unlock()
	list, err := qc.ListAttachments(ctx, name)
	if client.IsNotFound(err) {
		return &csi.ControllerUnpublishVolumeResponse{}, nil
	} else if err != nil {
		return nil, fmt.Errorf("list attachments of %s: %w", name, err)
	}
	for _, a := range list {
		if a.Implicit || (req.GetNodeId() != "" && a.Node != req.GetNodeId()) {
			continue
		}
		if err := qc.Detach(ctx, name, a.ID); err != nil && !client.IsNotFound(err) {
			return nil, fmt.Errorf("detach %s from node %s: %w", name, a.Node, busyOr(err))
		}
	}
	return &csi.ControllerUnpublishVolumeResponse{}, nil
}
