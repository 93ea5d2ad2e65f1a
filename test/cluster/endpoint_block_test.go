package clustertest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/endpoint"
	"github.com/quiverstorage/quiver/internal/kubevirt"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// TestEndpointBlockGuest is the Block-mode half of issues 30's acceptances
// 1 and 2: a Block-mode PVC is one block device holding every disk of the
// volume, made on the compute node the way the CSI node plugin makes it
// with an endpoint (the endpoint's device agent runs nbdfuse on the
// volume's @disks export, disk i at i*endpoint.SlotSize, and a loop device
// over it), and QEMU gets each disk as a slice of that device, as libvirt
// makes of the hook's <slices> and <shareable/> (a host_device node per
// disk, a raw node with offset and size, share-rw). The guest writes its
// three disks (found by serial), the storage nodes' primary is SIGKILLed
// and then the node without a copy: the guest's writes go on within L + 3 s
// with no failed request; at the end every record QEMU completed is on
// the disk it was written to.
func TestEndpointBlockGuest(t *testing.T) {
	for _, tool := range []string{"qemu-system-x86_64", "nbdfuse", "losetup", "ss"} {
		testfs.RequireTool(t, tool)
	}
	c, k, initrd, v := startEndpointRig(t, "blk")
	ctx := context.Background()
	dir := shortTempDir(t, "qeb")
	c.startEndpoint(t, dir, c.nodes...)
	ctl := endpoint.NewClient(filepath.Join(dir, "ep.sock"))
	_, pub := c.publishAt(t, ctl, v, "compute-1")
	// The CSI node plugin's staging: the device of every disk, held by the
	// endpoint.
	fuseDir := filepath.Join(dir, "fuse", "blk")
	uri := "nbd+unix:///" + endpoint.DisksExport + "?socket=" + pub.Socket
	loop, pid, err := ctl.Attach(ctx, fuseDir, endpoint.DisksExport, uri, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ctl.Detach(context.Background(), fuseDir, endpoint.DisksExport, loop, pid); err != nil {
			t.Errorf("detach the device: %v", err)
		}
	})
	size, err := os.ReadFile(filepath.Join("/sys/class/block", filepath.Base(loop), "size"))
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(len(endpointDisks)) * endpoint.SlotSize / 512; strings.TrimSpace(string(size)) != itoa(want) {
		t.Fatalf("%s has %s sectors, want %d (%d slots of %d bytes)", loop, strings.TrimSpace(string(size)), want, len(endpointDisks), endpoint.SlotSize)
	}
	// The domain virt-launcher writes for the Block PVC (its device the
	// one the endpoint holds), through the KubeVirt hook with the webhook's
	// layout: QEMU gets every disk as libvirt makes the hook's slices.
	var layout kubevirt.BlockDisks = map[string][]kubevirt.BlockDisk{"rootdisk": nil}
	for _, d := range v.Disks {
		layout["rootdisk"] = append(layout["rootdisk"], kubevirt.BlockDisk{Name: d.Name, Size: d.Size})
	}
	drives := qemuDrives(t, throughHook(t, launcherDomain(blockPVCDisk(loop)),
		map[string]string{kubevirt.AnnotationBlockDisks: layout.Format()}))
	vm := startGuestVMRaw(t, c, k, initrd, endpointDisks, func(_ int, d string) []string { return drives[d] })
	vm.waitStarted(t)
	checkSerials(t, vm)
	var stalls []string
	for i, role := range []string{"primary", "spare"} {
		stalls = append(stalls, c.killUnderGuest(t, vm, "blk", i, role, nil))
	}
	c.checkGuestRecords(t, vm, "blk", true)
	t.Logf("from each kill to the guest's next writes: %v (limit L + 3 s = %v)", stalls, failoverLimit())
}
