package csi

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testfs"
)

func mountCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

func blockCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
	}
}

// createVolume creates a volume and returns its ID; t.Cleanup deletes it.
func createVolume(t *testing.T, p *plugin, req *csi.CreateVolumeRequest) string {
	t.Helper()
	resp, err := p.ctrl.CreateVolume(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	volID := resp.GetVolume().GetVolumeId()
	t.Cleanup(func() {
		if _, err := p.ctrl.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: volID}); err != nil {
			t.Errorf("DeleteVolume: %v", err)
		}
	})
	return volID
}

// publishAll runs the CO's sequence for one node: ControllerPublish,
// NodeStage, NodePublish; t.Cleanup undoes it in reverse.
func publishAll(t *testing.T, p *plugin, volID string, vc *csi.VolumeCapability, staging, target string) {
	t.Helper()
	ctx := t.Context()
	pub, err := p.ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{
		VolumeId: volID, NodeId: p.d.cfg.NodeID, VolumeCapability: vc,
	})
	if err != nil {
		t.Fatalf("ControllerPublishVolume: %v", err)
	}
	if pub.GetPublishContext()[PublishToken] == "" {
		t.Fatalf("publish_context %v has no token", pub.GetPublishContext())
	}
	if _, err := p.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{
		VolumeId: volID, StagingTargetPath: staging, VolumeCapability: vc, PublishContext: pub.GetPublishContext(),
	}); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	if _, err := p.node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{
		VolumeId: volID, StagingTargetPath: staging, TargetPath: target, VolumeCapability: vc,
		PublishContext: pub.GetPublishContext(),
	}); err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if _, err := p.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: volID, TargetPath: target}); err != nil {
			t.Errorf("NodeUnpublishVolume: %v", err)
		}
		if _, err := p.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: volID, StagingTargetPath: staging}); err != nil {
			t.Errorf("NodeUnstageVolume: %v", err)
		}
		if _, err := p.ctrl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: volID, NodeId: p.d.cfg.NodeID}); err != nil {
			t.Errorf("ControllerUnpublishVolume: %v", err)
		}
	})
}

// TestPublishFilesystemThreeDisks publishes a Filesystem-mode volume made
// with disks=root,data,logs and finds the three images at the target path,
// of the sizes asked for; data written to one through the target is read
// back through the API's view of the pool.
func TestPublishFilesystemThreeDisks(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	testfs.RequireRoot(t)
	s := startServer(t)
	p := startPlugin(t, s, "node-a", true)
	vc := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	volID := createVolume(t, p, &csi.CreateVolumeRequest{
		Name:               "pvc-vm-three-disks",
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 1 << 30},
		VolumeCapabilities: []*csi.VolumeCapability{vc},
		Parameters:         map[string]string{ParamDisks: "root=256Mi,data=512Mi,logs=64Mi", ParamQoSRWIOPS: "500", ParamReplication: "1"},
	})
	v, err := s.api.GetVolume(t.Context(), volID)
	if err != nil {
		t.Fatal(err)
	}
	if v.QoS == nil || v.QoS.RWIOPS != 500 || v.Labels[LabelReplication] != "1" || v.Replicas != 1 || v.Capacity != 1<<30 {
		t.Fatalf("volume %+v: want QoS rwIOPS 500, label %s=1, 1 replica, capacity 1Gi", v, LabelReplication)
	}

	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "pod", "volume")
	publishAll(t, p, volID, vc, staging, target)

	entries, err := os.ReadDir(target)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"data.img", "logs.img", "root.img"}; !slices.Equal(names, want) {
		t.Fatalf("target %s holds %v, want %v", target, names, want)
	}
	sizes := map[string]int64{"root.img": 256 << 20, "data.img": 512 << 20, "logs.img": 64 << 20}
	for name, size := range sizes {
		fi, err := os.Stat(filepath.Join(target, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() != size {
			t.Errorf("%s is %d bytes, want %d", name, fi.Size(), size)
		}
	}
	// The target is the volume's own directory, not a copy.
	msg := []byte("written through the CSI target path")
	f, err := os.OpenFile(filepath.Join(target, "data.img"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(msg, 4096); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	df, err := os.Open(v.Disks[1].Path)
	if err != nil {
		t.Fatal(err)
	}
	defer df.Close()
	if _, err := df.ReadAt(got, 4096); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("the pool's %s reads %q (%v), want %q", v.Disks[1].Path, got, err, msg)
	}

	stats, err := p.node.NodeGetVolumeStats(t.Context(), &csi.NodeGetVolumeStatsRequest{VolumeId: volID, VolumePath: target})
	if err != nil {
		t.Fatal(err)
	}
	u := stats.GetUsage()[0]
	if u.GetTotal() != 1<<30 || u.GetUsed() <= 0 || u.GetAvailable() != u.GetTotal()-u.GetUsed() {
		t.Errorf("stats %+v: want total 1Gi, used > 0 (a block was written), available = total - used", u)
	}
}

// TestPublishBlock publishes a Block-mode volume: the target is a block
// device that mkfs.ext4 formats and mount mounts; a file written in it is
// found again in the disk read through NBD, outside the plugin.
func TestPublishBlock(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	testfs.RequireRoot(t)
	for _, tool := range []string{"nbdfuse", "losetup", "blockdev", "mkfs.ext4", "mount", "umount", "nbdcopy", "debugfs"} {
		testfs.RequireTool(t, tool)
	}
	s := startServer(t)
	p := startPlugin(t, s, "node-b", true)
	vc := blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	volID := createVolume(t, p, &csi.CreateVolumeRequest{
		Name:               "pvc-block-vm",
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 128 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{vc},
	})
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "pod", "dev")
	publishAll(t, p, volID, vc, staging, target)

	fi, err := os.Stat(target)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeDevice == 0 || fi.Mode()&os.ModeCharDevice != 0 {
		t.Fatalf("target %s has mode %v, want a block device", target, fi.Mode())
	}
	out, err := exec.Command("blockdev", "--getsize64", target).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "134217728" {
		t.Fatalf("blockdev --getsize64 %s: %q %v, want 134217728", target, out, err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", target).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v\n%s", err, out)
	}
	mnt := filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", target, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v\n%s", err, out)
	}
	msg := "hello from a quiver block volume\n"
	werr := os.WriteFile(filepath.Join(mnt, "hello.txt"), []byte(msg), 0o644)
	if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
		t.Fatalf("umount: %v\n%s", err, out)
	}
	if werr != nil {
		t.Fatal(werr)
	}
	// Read the disk back through NBD (a read-only attachment of its own:
	// a server with a token file serves no tokenless export) and look for
	// the file in the ext4 image.
	img := filepath.Join(dir, "copy.img")
	ro, err := s.api.Attach(t.Context(), volID, api.AttachmentSpec{Node: "reader", Mode: "ro"})
	if err != nil {
		t.Fatal(err)
	}
	uri := "nbd+unix:///" + volID + "/" + DefaultDisk + "/" + ro.Token + "?socket=" + s.nbdSocket
	if out, err := exec.Command("nbdcopy", uri, img).CombinedOutput(); err != nil {
		t.Fatalf("nbdcopy %s: %v\n%s", uri, err, out)
	}
	if err := s.api.Detach(t.Context(), volID, ro.ID); err != nil {
		t.Fatal(err)
	}
	got, err := exec.Command("debugfs", "-R", "cat /hello.txt", img).Output()
	if err != nil || string(got) != msg {
		t.Fatalf("debugfs cat /hello.txt from the NBD copy: %q %v, want %q", got, err, msg)
	}
	stats, err := p.node.NodeGetVolumeStats(t.Context(), &csi.NodeGetVolumeStatsRequest{VolumeId: volID, VolumePath: target})
	if err != nil {
		t.Fatal(err)
	}
	if u := stats.GetUsage()[0]; u.GetTotal() != 128<<20 || u.GetUsed() <= 0 {
		t.Errorf("stats %+v: want total 128Mi and used > 0 after mkfs", u)
	}
}

// TestExportVolume: the volume part of an attachment's NBD URIs is what the
// node opens (the pool's name of a tenant's volume on a cluster).
func TestExportVolume(t *testing.T) {
	for _, tc := range []struct {
		uris map[string]string
		want string
	}{
		{map[string]string{"root": "nbd://10.0.0.1:10809/acme--web/root/tok"}, "acme--web"},
		{map[string]string{"disk": "nbds://h:10809/web/disk/tok"}, "web"},
		{map[string]string{"disk": "nbd+unix:///acme--db/disk/tok?socket=%2Frun%2Fnbd.sock"}, "acme--db"},
		{map[string]string{"b": "nbd://h/v2/b/t", "a": "nbd://h/v1/a/t"}, "v1"},
		{map[string]string{"disk": "nbd://h:10809/"}, ""},
		{map[string]string{"disk": "::not a uri"}, ""},
		{nil, ""},
	} {
		if got := exportVolume(tc.uris); got != tc.want {
			t.Errorf("exportVolume(%v) = %q, want %q", tc.uris, got, tc.want)
		}
	}
}

// TestFilesystemDirectAccessIsTracked: a single node's Filesystem-mode
// staging hands the VM the image files, whose writes quiver never sees;
// the volume says so while it is staged, and the change tracking reports
// its disks changed whole, so a backup reads them whole. Unstaged, the
// mark goes.
func TestFilesystemDirectAccessIsTracked(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	testfs.RequireRoot(t)
	s := startServer(t)
	p := startPlugin(t, s, "node-a", true)
	ctx := t.Context()
	vc := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	volID := createVolume(t, p, &csi.CreateVolumeRequest{
		Name:               "pvc-vm-direct",
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{vc},
		Parameters:         map[string]string{ParamDisks: "root=16Mi,data=16Mi"},
	})
	if _, err := s.api.CreateSnapshot(ctx, volID, "before"); err != nil {
		t.Fatal(err)
	}
	pub, err := p.ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: volID, NodeId: "node-a", VolumeCapability: vc})
	if err != nil {
		t.Fatal(err)
	}
	staging := filepath.Join(t.TempDir(), "staging")
	if _, err := p.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: volID, StagingTargetPath: staging,
		VolumeCapability: vc, PublishContext: pub.GetPublishContext()}); err != nil {
		t.Fatal(err)
	}
	v, err := s.api.GetVolume(ctx, volID)
	if err != nil || !slices.Equal(v.DirectAccess, []string{"node-a"}) {
		t.Fatalf("staged volume's direct access: %v %v, want [node-a]", v.DirectAccess, err)
	}
	// The VM writes a file itself.
	f, err := os.OpenFile(filepath.Join(staging, "data.img"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("behind quiver's back"), 5<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := s.api.CreateSnapshot(ctx, volID, "during"); err != nil {
		t.Fatal(err)
	}
	for _, from := range []string{"before", "during"} {
		ch, err := s.api.SnapshotChanges(ctx, volID, from, "")
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range ch.Disks {
			if !d.Whole {
				t.Errorf("changes from %s while staged: disk %s %+v, want whole", from, d.Disk, d)
			}
		}
	}
	if _, err := p.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: volID, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.ctrl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: volID, NodeId: "node-a"}); err != nil {
		t.Fatal(err)
	}
	if v, err = s.api.GetVolume(ctx, volID); err != nil || len(v.DirectAccess) != 0 {
		t.Fatalf("unstaged volume's direct access: %v %v", v.DirectAccess, err)
	}
	// Tracked again from the next checkpoint on.
	for _, name := range []string{"after", "later"} {
		if _, err := s.api.CreateSnapshot(ctx, volID, name); err != nil {
			t.Fatal(err)
		}
	}
	ch, err := s.api.SnapshotChanges(ctx, volID, "after", "later")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ch.Disks {
		if d.Whole || d.Changed != 0 {
			t.Errorf("changes between two checkpoints after unstaging: %+v", d)
		}
	}
	for _, s2 := range []string{"before", "during", "after", "later"} {
		_ = s.api.DeleteSnapshot(context.Background(), volID, s2)
	}
}

// TestFilesystemEncryptedRefused: Filesystem mode would hand a VM the image
// files of an encrypted volume, which hold ciphertext: staging refuses it,
// read-only too, with FailedPrecondition and a message that says why, and
// records no direct access.
func TestFilesystemEncryptedRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	testfs.RequireRoot(t)
	s := startServer(t, "--key-file", filepath.Join(t.TempDir(), "keys.json"))
	p := startPlugin(t, s, "node-a", true)
	ctx := t.Context()
	if _, err := s.api.CreateVolume(ctx, api.VolumeSpec{Name: "vault", Capacity: 16 << 20, Encrypt: true,
		Disks: []api.DiskSpec{{Name: "root", Size: 16 << 20}}}); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []csi.VolumeCapability_AccessMode_Mode{csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
		csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY} {
		vc := mountCap(mode)
		pub, err := p.ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: "vault", NodeId: "node-a",
			VolumeCapability: vc, Readonly: mode == csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY})
		if err != nil {
			t.Fatal(err)
		}
		staging := filepath.Join(t.TempDir(), "staging")
		_, err = p.node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: "vault", StagingTargetPath: staging,
			VolumeCapability: vc, PublishContext: pub.GetPublishContext()})
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "encrypted") {
			t.Fatalf("%v: NodeStageVolume of an encrypted volume: %v, want FailedPrecondition saying it is encrypted", mode, err)
		}
		if entries, _ := os.ReadDir(staging); len(entries) > 0 {
			t.Fatalf("%v: staging path holds %d entries", mode, len(entries))
		}
		if v, err := s.api.GetVolume(ctx, "vault"); err != nil || len(v.DirectAccess) != 0 {
			t.Fatalf("%v: direct access %v %v, want none", mode, v.DirectAccess, err)
		}
		if _, err := p.ctrl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: "vault", NodeId: "node-a"}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestEncryptedStorageClass: encrypted: "true" makes an encrypted volume;
// a clone of it is encrypted too, and a StorageClass that asks a clone for
// another encryption than its source's is refused; a server without a key
// provider refuses with FailedPrecondition.
func TestEncryptedStorageClass(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	s := startServer(t, "--key-file", filepath.Join(t.TempDir(), "keys.json"))
	p := startPlugin(t, s, "node-a", true)
	ctx := t.Context()
	vc := blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	enc := map[string]string{ParamDisks: "root=16Mi", ParamEncrypted: "true"}
	volID := createVolume(t, p, &csi.CreateVolumeRequest{Name: "pvc-enc", CapacityRange: &csi.CapacityRange{RequiredBytes: 16 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{vc}, Parameters: enc})
	v, err := s.api.GetVolume(ctx, volID)
	if err != nil || v.Encryption == nil {
		t.Fatalf("volume of encrypted: \"true\": encryption %v (%v), want one", v.Encryption, err)
	}
	clone := createVolume(t, p, &csi.CreateVolumeRequest{Name: "pvc-enc-clone", VolumeCapabilities: []*csi.VolumeCapability{vc},
		Parameters:          enc,
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: volID}}}})
	if c, err := s.api.GetVolume(ctx, clone); err != nil || c.Encryption == nil || c.Encryption.KeyID == v.Encryption.KeyID {
		t.Fatalf("clone's encryption %+v (%v), want a KEK of its own", c.Encryption, err)
	}
	_, err = p.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-plain-clone", VolumeCapabilities: []*csi.VolumeCapability{vc},
		Parameters:          map[string]string{ParamEncrypted: "false"},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: volID}}}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "encrypted") {
		t.Fatalf("a clone in the clear of an encrypted volume: %v, want InvalidArgument", err)
	}

	plain := startServer(t)
	pp := startPlugin(t, plain, "node-b", true)
	_, err = pp.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-enc", VolumeCapabilities: []*csi.VolumeCapability{vc}, Parameters: enc})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "key provider") {
		t.Fatalf("encrypted volume on a server without a key provider: %v, want FailedPrecondition", err)
	}
}
