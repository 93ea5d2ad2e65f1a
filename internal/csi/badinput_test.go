package csi

import (
	"context"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quiverstorage/quiver/internal/api"
)

// wantCode checks an RPC's error code and that its message names what is
// wrong.
func wantCode(t *testing.T, what string, err error, code codes.Code, mention string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code {
		t.Errorf("%s: code %v (%v), want %v", what, st.Code(), err, code)
		return
	}
	if mention != "" && !strings.Contains(st.Message(), mention) {
		t.Errorf("%s: message %q does not mention %q", what, st.Message(), mention)
	}
}

// TestBadInput sends requests the CSI spec names an error for and checks
// the gRPC code and that the message names the field or object.
func TestBadInput(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	s := startServer(t)
	p := startPlugin(t, s, "node-x", true)
	ctx := t.Context()
	fs := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	create := func(name string, params map[string]string, rng *csi.CapacityRange, caps ...*csi.VolumeCapability) error {
		if caps == nil {
			caps = []*csi.VolumeCapability{fs}
		}
		_, err := p.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, Parameters: params, CapacityRange: rng, VolumeCapabilities: caps})
		return err
	}
	ext4 := &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	unknownMode := mountCap(csi.VolumeCapability_AccessMode_UNKNOWN)
	noType := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}

	t.Run("parameters", func(t *testing.T) {
		cases := []struct {
			params  map[string]string
			code    codes.Code
			mention string
		}{
			{map[string]string{"fstype": "ext4"}, codes.InvalidArgument, `unknown parameter "fstype"`},
			{map[string]string{"disks": "root=40Gx"}, codes.InvalidArgument, "disk root"},
			{map[string]string{"disks": "Root!=1Gi"}, codes.InvalidArgument, `disk name "Root!"`},
			{map[string]string{"disks": "root=1Gi,root=2Gi"}, codes.InvalidArgument, "given twice"},
			{map[string]string{"disks": "root"}, codes.InvalidArgument, "NAME=SIZE"},
			{map[string]string{"disks": "root=1000"}, codes.InvalidArgument, "multiple of 512"},
			{map[string]string{"qos_rw_iops": "-1"}, codes.InvalidArgument, "qos_rw_iops"},
			{map[string]string{"qos_rw_mbytes": "fast"}, codes.InvalidArgument, "qos_rw_mbytes"},
			{map[string]string{"replication": "0"}, codes.InvalidArgument, "replication"},
			// Enforced: a single storage node keeps one copy only.
			{map[string]string{"replication": "2"}, codes.ResourceExhausted, "single node"},
			{map[string]string{"disks": "root=2Gi"}, codes.OutOfRange, "limit_bytes"},
		}
		for _, c := range cases {
			err := create("pvc-bad-params", c.params, &csi.CapacityRange{RequiredBytes: 1 << 30, LimitBytes: 1 << 30})
			wantCode(t, "CreateVolume "+strings.Join(keys(c.params), ","), err, c.code, c.mention)
		}
	})

	t.Run("capabilities and ranges", func(t *testing.T) {
		wantCode(t, "fs_type ext4", create("pvc-bad-caps", nil, nil, ext4), codes.InvalidArgument, `fs_type "ext4"`)
		wantCode(t, "access mode UNKNOWN", create("pvc-bad-caps", nil, nil, unknownMode), codes.InvalidArgument, "access mode")
		wantCode(t, "no access type", create("pvc-bad-caps", nil, nil, noType), codes.InvalidArgument, "access_type")
		wantCode(t, "required above limit", create("pvc-bad-caps", nil, &csi.CapacityRange{RequiredBytes: 2 << 30, LimitBytes: 1 << 30}),
			codes.InvalidArgument, "required_bytes")
		wantCode(t, "limit below 512", create("pvc-bad-caps", nil, &csi.CapacityRange{LimitBytes: 100}), codes.OutOfRange, "limit_bytes")
		wantCode(t, "name too long", create(strings.Repeat("x", 129), nil, nil), codes.InvalidArgument, "at most 128")
		_, err := p.ctrl.ValidateVolumeCapabilities(ctx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "pvc-none", VolumeCapabilities: []*csi.VolumeCapability{fs}})
		wantCode(t, "ValidateVolumeCapabilities unknown volume", err, codes.NotFound, "pvc-none")
	})

	t.Run("unknown IDs", func(t *testing.T) {
		src := func(s *csi.VolumeContentSource) error {
			_, err := p.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-from-nothing", VolumeCapabilities: []*csi.VolumeCapability{fs}, VolumeContentSource: s})
			return err
		}
		wantCode(t, "clone of unknown snapshot", src(&csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "pvc-none@snap"}}}), codes.NotFound, "pvc-none@snap")
		wantCode(t, "clone of malformed snapshot ID", src(&csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "no-at-sign"}}}), codes.NotFound, "no-at-sign")
		wantCode(t, "clone of unknown volume", src(&csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
			Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: "pvc-none"}}}), codes.NotFound, "pvc-none")
		_, err := p.ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: "pvc-none", NodeId: "node-x", VolumeCapability: fs})
		wantCode(t, "ControllerPublishVolume unknown volume", err, codes.NotFound, "pvc-none")
		_, err = p.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: "pvc-none", CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 30}})
		wantCode(t, "ControllerExpandVolume unknown volume", err, codes.NotFound, "pvc-none")
		_, err = p.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: "pvc-none"})
		wantCode(t, "CreateSnapshot of unknown volume", err, codes.NotFound, "pvc-none")
		_, err = p.ctrl.GetSnapshot(ctx, &csi.GetSnapshotRequest{SnapshotId: "pvc-none@x"})
		wantCode(t, "GetSnapshot unknown", err, codes.NotFound, "pvc-none@x")
		_, err = p.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "Not_A_Volume", StagingTargetPath: t.TempDir(), VolumeCapability: fs})
		wantCode(t, "NodeStageVolume malformed ID", err, codes.NotFound, "Not_A_Volume")
		_, err = p.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "pvc-none", StagingTargetPath: t.TempDir(), VolumeCapability: fs})
		wantCode(t, "NodeStageVolume unknown volume", err, codes.NotFound, "pvc-none")
		_, err = p.node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: "pvc-none", VolumePath: "/x"})
		wantCode(t, "NodeGetVolumeStats unknown volume", err, codes.NotFound, "pvc-none")
		_, err = p.ctrl.ListVolumes(ctx, &csi.ListVolumesRequest{StartingToken: "page-2"})
		wantCode(t, "ListVolumes foreign token", err, codes.Aborted, "page-2")
		_, err = p.ctrl.ListSnapshots(ctx, &csi.ListSnapshotsRequest{StartingToken: "after:nope"})
		wantCode(t, "ListSnapshots malformed token", err, codes.Aborted, "after:nope")
	})

	t.Run("missing secrets", func(t *testing.T) {
		anon := startPlugin(t, s, "node-y", false)
		req := &csi.CreateVolumeRequest{Name: "pvc-secret", VolumeCapabilities: []*csi.VolumeCapability{fs}}
		_, err := anon.ctrl.CreateVolume(ctx, req)
		wantCode(t, "CreateVolume without a token", err, codes.Unauthenticated, "token")
		req.Secrets = map[string]string{SecretToken: "wrong"}
		_, err = anon.ctrl.CreateVolume(ctx, req)
		wantCode(t, "CreateVolume with a wrong token", err, codes.Unauthenticated, "token")
		req.Secrets = map[string]string{SecretToken: " "}
		_, err = anon.ctrl.CreateVolume(ctx, req)
		wantCode(t, "CreateVolume with an empty token", err, codes.Unauthenticated, SecretToken)
		req.Secrets = map[string]string{SecretToken: s.token}
		if _, err := anon.ctrl.CreateVolume(ctx, req); err != nil {
			t.Fatalf("CreateVolume with the token in its secrets: %v", err)
		}
		_, err = anon.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "pvc-secret"})
		wantCode(t, "DeleteVolume without a token", err, codes.Unauthenticated, "token")
		if _, err := anon.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "pvc-secret", Secrets: req.Secrets}); err != nil {
			t.Fatalf("DeleteVolume with the token: %v", err)
		}
	})

	t.Run("state", func(t *testing.T) {
		// A volume made by hand is never adopted nor deleted.
		if _, err := s.api.CreateVolume(ctx, api.VolumeSpec{Name: "pvc-by-hand", Capacity: 1 << 20}); err != nil {
			t.Fatal(err)
		}
		wantCode(t, "CreateVolume over a hand-made volume", create("pvc-by-hand", nil, nil), codes.AlreadyExists, "not made for this CSI name")
		_, err := p.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "pvc-by-hand"})
		wantCode(t, "DeleteVolume of a hand-made volume", err, codes.FailedPrecondition, "was not made by")
		if _, err := s.api.GetVolume(ctx, "pvc-by-hand"); err != nil {
			t.Fatalf("the hand-made volume is gone: %v", err)
		}
		// Same name, other size.
		if err := create("pvc-twice", nil, &csi.CapacityRange{RequiredBytes: 1 << 20, LimitBytes: 1 << 20}); err != nil {
			t.Fatal(err)
		}
		wantCode(t, "CreateVolume same name, larger", create("pvc-twice", nil, &csi.CapacityRange{RequiredBytes: 2 << 20}), codes.AlreadyExists, "capacity")
		// A volume with snapshots cannot be deleted: quiver keeps them in it.
		if _, err := p.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-1", SourceVolumeId: "pvc-twice"}); err != nil {
			t.Fatal(err)
		}
		_, err = p.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: "pvc-twice"})
		wantCode(t, "DeleteVolume with a snapshot", err, codes.FailedPrecondition, "snapshots")
		// Another operation on the volume in progress.
		unlock, err := p.d.locks.tryLock("pvc-twice")
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.ctrl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: "pvc-twice", CapacityRange: &csi.CapacityRange{RequiredBytes: 4 << 20}})
		wantCode(t, "ControllerExpandVolume while the volume is busy", err, codes.Aborted, "pvc-twice")
		unlock()
		// Publishing without staging first.
		_, err = p.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "pvc-twice", TargetPath: t.TempDir() + "/t",
			StagingTargetPath: t.TempDir(), VolumeCapability: fs})
		wantCode(t, "NodePublishVolume before NodeStageVolume", err, codes.FailedPrecondition, "not staged")
		_, err = p.ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: "pvc-twice", NodeId: "some-other-node", VolumeCapability: fs})
		wantCode(t, "ControllerPublishVolume to an unknown node", err, codes.NotFound, "some-other-node")
		for _, cleanup := range []func() error{
			func() error {
				_, err := p.ctrl.DeleteSnapshot(context.Background(), &csi.DeleteSnapshotRequest{SnapshotId: "pvc-twice@snap-1"})
				return err
			},
			func() error {
				_, err := p.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: "pvc-twice"})
				return err
			},
		} {
			if err := cleanup(); err != nil {
				t.Error(err)
			}
		}
	})
}

func keys(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	return out
}
