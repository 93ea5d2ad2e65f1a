package clustertest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/endpoint"
	"github.com/quiverstorage/quiver/internal/kubevirt"
	"github.com/quiverstorage/quiver/internal/testfs"
	guestrecord "github.com/quiverstorage/quiver/test/migration/record"
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
	k, initrd := buildWriterGuest(t, endpointDisks)
	c := startCluster(t)
	c.waitNodes(c.nodes[0], "n1 n2 n3 up", allUp("n1", "n2", "n3"))
	ctx := context.Background()
	spec := api.VolumeSpec{Name: "blk", Capacity: int64(len(volumeDisks)) * guestDiskSize, Replicas: 2}
	for _, d := range volumeDisks {
		spec.Disks = append(spec.Disks, api.DiskSpec{Name: d, Size: guestDiskSize})
	}
	v, err := c.nodes[0].api().CreateVolume(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	att, err := c.nodes[0].api().Attach(ctx, "blk", api.AttachmentSpec{Node: "compute-1"})
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "qeb") // short: unix socket paths
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c.startEndpoint(t, dir, c.nodes...)
	ctl := endpoint.NewClient(filepath.Join(dir, "ep.sock"))
	pv := endpoint.Volume{Name: "blk", Token: att.Token}
	for _, d := range v.Disks {
		pv.Disks = append(pv.Disks, endpoint.Disk{Name: d.Name, Size: d.Size})
	}
	pub, err := ctl.Publish(ctx, pv)
	if err != nil {
		t.Fatal(err)
	}
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
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	err = vm.WaitConsole(wctx, "guestwriter: start")
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	checkSerials(t, vm)
	lease, _ := time.ParseDuration(leaseTTL)
	limit := lease + 3*time.Second
	var stalls []string
	for i, role := range []string{"primary", "spare"} {
		vm.waitWrites(t, vm.writes(t)["vda"].WrOperations+100, 2*time.Minute)
		cur := c.waitVolume(t, c.nodes[0], "blk", "copies in sync", bothInSync)
		victim := c.byName(cur.Primary)
		if role == "spare" {
			victim = c.other(c.byName(cur.Primary), c.byName(otherCopy(cur)))
		}
		leader := c.etcdLeader(t) == victim
		if leader {
			role += " (etcd leader)"
		}
		most := int64(0)
		for _, s := range vm.writes(t) {
			most = max(most, s.WrOperations)
		}
		victim.proc.Kill()
		killed := time.Now()
		vm.waitWrites(t, most+2, 2*time.Minute)
		stall := time.Since(killed)
		stalls = append(stalls, role+" "+stall.Round(time.Millisecond).String())
		if allowed := limitFor(limit, leader); stall > allowed {
			t.Errorf("cycle %d: the guest's writes went on %v after the kill of the %s %s, more than %v",
				i, stall.Round(time.Millisecond), role, victim.name, allowed)
		}
		vm.waitWrites(t, most+30, 2*time.Minute)
		vm.checkHealthy(t)
		now := c.waitVolume(t, c.other(victim), "blk", "a primary up", func(x api.Volume) bool { return x.Primary != "" && x.Primary != victim.name })
		t.Logf("cycle %d: killed the %s %s; the guest's writes went on %v after; primary %s at term %d",
			i, role, victim.name, stall.Round(time.Millisecond), now.Primary, now.Term)
		c.spawn(victim)
		c.waitReady(victim)
		if strings.HasPrefix(role, "primary") {
			c.waitInSync(t, c.byName(now.Primary), "blk", victim.name, 2*time.Minute)
		}
	}
	if err := vm.qmp.Execute(ctx, "stop", nil, nil); err != nil {
		t.Fatal(err)
	}
	stats := vm.writes(t)
	vm.checkHealthy(t)
	final := c.waitVolume(t, c.nodes[0], "blk", "both copies in sync", bothInSync)
	fp := c.byName(final.Primary)
	for di, d := range endpointDisks {
		img, err := os.ReadFile(filepath.Join(fp.pool, "volumes", "blk", "disks", volumeDisks[di]+".img"))
		if err != nil {
			t.Fatal(err)
		}
		n, err := guestrecord.Count(img, uint64(di))
		if err != nil {
			t.Fatalf("%s on the primary %s: %v", d, fp.name, err)
		}
		if s := stats[d]; n != s.WrOperations || s.FlushOperations == 0 {
			t.Fatalf("%s on the primary %s holds records 0..%d, QEMU completed %d writes and %d flushes",
				d, fp.name, n-1, s.WrOperations, s.FlushOperations)
		}
		t.Logf("%s (disk %s, slot %d of %s): records 0..%d intact on %s", d, volumeDisks[di], di, loop, n-1, fp.name)
	}
	t.Logf("from each kill to the guest's next writes: %v (limit L + 3 s = %v)", stalls, limit)
}
