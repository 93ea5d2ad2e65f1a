package clustertest

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/csi"
	"github.com/quiverstorage/quiver/internal/csi/csitest"
)

// csiController runs an in-process CSI controller whose quiver endpoint is
// nd's API, until the test ends, and returns its gRPC client.
func (c *cluster) csiController(t *testing.T, nd *node) csipb.ControllerClient {
	t.Helper()
	return csitest.Start(t, c.csiConfig(t, nd, csi.Config{Mode: csi.ModeController, Token: apiToken})).Controller()
}

// csiPlugin runs an in-process CSI plugin configured by cfg (its mode,
// token, node fields) whose quiver endpoint is nd's API, until the test
// ends, and returns its endpoint and a gRPC connection to it.
func (c *cluster) csiPlugin(t *testing.T, nd *node, cfg csi.Config) (string, *grpc.ClientConn) {
	t.Helper()
	p := csitest.Start(t, c.csiConfig(t, nd, cfg))
	return p.Endpoint, p.Conn
}

// csiConfig points cfg at nd's API through the cluster's network, with a
// state directory of the test's when cfg has none.
func (c *cluster) csiConfig(t *testing.T, nd *node, cfg csi.Config) csi.Config {
	cfg.Server = "http://" + nd.ip + ":7480"
	cfg.HTTPClient = &http.Client{Transport: &http.Transport{DialContext: c.net.Dial}, Timeout: 120 * time.Second}
	if cfg.StateDir == "" {
		cfg.StateDir = filepath.Join(t.TempDir(), "state")
	}
	return cfg
}

// TestAnyNodeCSI: the CSI controller pointed at a node that is not a
// replicated volume's primary takes a snapshot of it (CreateSnapshot) and
// clones it from the snapshot and from the live volume (CreateVolume with a
// volume content source): each is made by the primary on every copy.
func TestAnyNodeCSI(t *testing.T) {
	c := startCluster(t)
	ctx := context.Background()
	c.waitNodes(c.nodes[0], "n1 n2 n3 up", allUp("n1", "n2", "n3"))
	block := []*csipb.VolumeCapability{{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}
	create := func(ctrl csipb.ControllerClient, name string, src *csipb.VolumeContentSource) *csipb.Volume {
		t.Helper()
		resp, err := ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: name, VolumeCapabilities: block,
			CapacityRange: &csipb.CapacityRange{RequiredBytes: 4 * mib}, Parameters: map[string]string{"replication": "2"},
			VolumeContentSource: src})
		if err != nil {
			t.Fatalf("CSI CreateVolume %s: %v", name, err)
		}
		return resp.GetVolume()
	}
	src := create(c.csiController(t, c.nodes[0]), "pvc-src", nil)
	v, err := c.nodes[0].api().GetVolume(ctx, src.GetVolumeId())
	if err != nil {
		t.Fatal(err)
	}
	prim, cp := c.byName(v.Primary), c.byName(copyNodes(v)[1])
	spare := c.other(prim, cp)
	att, err := prim.api().Attach(ctx, v.Name, api.AttachmentSpec{Node: "worker-1"})
	if err != nil {
		t.Fatal(err)
	}
	disk := v.Disks[0].Name
	c.qemuIO(t, fmt.Sprintf("nbd://%s:10809/%s/%s/%s", prim.ip, v.Name, disk, att.Token), "write -P 0x33 0 1M", "flush")
	if err := prim.api().Detach(ctx, v.Name, att.ID); err != nil {
		t.Fatal(err)
	}

	for _, via := range []*node{spare, cp} {
		ctrl := c.csiController(t, via)
		snap, err := ctrl.CreateSnapshot(ctx, &csipb.CreateSnapshotRequest{Name: "snap-" + via.name, SourceVolumeId: src.GetVolumeId()})
		if err != nil {
			t.Fatalf("CSI CreateSnapshot through %s (not the primary %s): %v", via.name, prim.name, err)
		}
		fromSnap := create(ctrl, "pvc-snap-"+via.name, &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{
			Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshot().GetSnapshotId()}}})
		fromVol := create(ctrl, "pvc-vol-"+via.name, &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Volume{
			Volume: &csipb.VolumeContentSource_VolumeSource{VolumeId: src.GetVolumeId()}}})
		for _, cl := range []*csipb.Volume{fromSnap, fromVol} {
			got, err := via.api().GetVolume(ctx, cl.GetVolumeId())
			if err != nil {
				t.Fatal(err)
			}
			if got.Primary != prim.name || len(got.Copies) != 2 {
				t.Errorf("clone %s through %s: primary %s, copies %+v; want %s and 2", got.Name, via.name, got.Primary, got.Copies, prim.name)
			}
			for _, nd := range []*node{prim, cp} {
				if !allBytes(fileBytes(t, nd, got.Name, disk, 0, mib), 0x33) {
					t.Errorf("clone %s on %s's copy lacks the source's data", got.Name, nd.name)
				}
			}
		}
		for _, nd := range []*node{prim, cp} {
			name := "snap-" + via.name
			if _, err := os.Stat(filepath.Join(nd.pool, "volumes", v.Name, "snapshots", name)); err != nil {
				t.Errorf("snapshot %s through %s on %s's copy: %v", name, via.name, nd.name, err)
			}
		}
	}
}
