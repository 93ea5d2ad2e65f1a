package clustertest

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/quiverstorage/quiver/internal/kubevirt"
	"github.com/quiverstorage/quiver/internal/kubevirt/hook"
)

// launcherDomain is a domain of the shape virt-launcher writes for a VMI
// whose volume "rootdisk" is a PVC: primary is its <disk>, with alias
// ua-rootdisk, target vda.
func launcherDomain(primary string) string {
	return `<domain type="qemu">
  <name>default_vm1</name>
  <memory unit="KiB">196608</memory>
  <os><type arch="x86_64" machine="q35">hvm</type></os>
  <devices>
    ` + primary + `
  </devices>
</domain>`
}

// filePVCDisk is KubeVirt's disk for a Filesystem-mode PVC whose directory
// (as QEMU sees it) is dir.
func filePVCDisk(dir string) string {
	return `<disk device="disk" type="file">
      <source file="` + dir + `/disk.img"></source>
      <target bus="virtio" dev="vda"></target>
      <driver cache="none" error_policy="stop" name="qemu" type="raw" io="native" discard="unmap"></driver>
      <alias name="ua-rootdisk"></alias>
    </disk>`
}

// blockPVCDisk is KubeVirt's disk for a Block-mode PVC whose device is dev.
func blockPVCDisk(dev string) string {
	return `<disk device="disk" type="block">
      <source dev="` + dev + `"></source>
      <target bus="virtio" dev="vda"></target>
      <driver cache="none" error_policy="stop" name="qemu" type="raw" io="native" discard="unmap"></driver>
      <alias name="ua-rootdisk"></alias>
    </disk>`
}

// throughHook passes the domain through quiver's KubeVirt hook for a VMI
// whose volume rootdisk is PVC vm1-disks, with annotations (the webhook's),
// and returns the hook's disks in domain order.
func throughHook(t *testing.T, domainXML string, annotations map[string]string) []libvirtxml.DomainDisk {
	t.Helper()
	vmiJSON, err := json.Marshal(map[string]any{
		"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
		"metadata": map[string]any{"name": "vm1", "namespace": "default", "annotations": annotations},
		"spec": map[string]any{"volumes": []any{
			map[string]any{"name": "rootdisk", "persistentVolumeClaim": map[string]any{"claimName": "vm1-disks"}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	vmi, err := kubevirt.DecodeVMI(vmiJSON)
	if err != nil {
		t.Fatal(err)
	}
	out, err := hook.AddDisks([]byte(domainXML), vmi, hook.Options{Volume: "rootdisk"})
	if err != nil {
		t.Fatalf("the hook: %v", err)
	}
	var dom libvirtxml.Domain
	if err := dom.Unmarshal(string(out)); err != nil {
		t.Fatalf("the hook's domain: %v\n%s", err, out)
	}
	return dom.Devices.Disks
}

// qemuDrives returns QEMU's arguments for the hook's disks as libvirt makes
// them, by the guest's device name (the disk's target): an NBD disk on a
// unix socket is an nbd node with its export and reconnect-delay; a block
// disk with a slice is a host_device node and a raw node with offset and
// size. The raw or nbd node is named "disk-<target>" (what guestVM reads
// in query-blockstats), the device carries the disk's serial, and a
// shareable disk gets share-rw.
func qemuDrives(t *testing.T, disks []libvirtxml.DomainDisk) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, d := range disks {
		dev := d.Target.Dev
		node := "disk-" + dev
		var args []string
		switch {
		case d.Source != nil && d.Source.Network != nil:
			n := d.Source.Network
			if n.Protocol != "nbd" || len(n.Hosts) != 1 || n.Hosts[0].Transport != "unix" {
				t.Fatalf("disk %s: source %+v, want NBD on a unix socket", dev, n)
			}
			bd := map[string]any{"driver": "nbd", "node-name": node, "export": n.Name,
				"server": map[string]string{"type": "unix", "path": n.Hosts[0].Socket}}
			if n.Reconnect != nil && n.Reconnect.Delay != "" {
				var delay int
				if _, err := fmt.Sscan(n.Reconnect.Delay, &delay); err != nil {
					t.Fatalf("disk %s: reconnect delay %q", dev, n.Reconnect.Delay)
				}
				bd["reconnect-delay"] = delay
			}
			args = append(args, "-blockdev", jsonArg(t, bd))
		case d.Source != nil && d.Source.Block != nil && d.Source.Slices != nil && len(d.Source.Slices.Slices) == 1:
			s := d.Source.Slices.Slices[0]
			args = append(args,
				"-blockdev", jsonArg(t, map[string]any{"driver": "host_device", "node-name": "file-" + dev,
					"filename": d.Source.Block.Dev, "cache": map[string]bool{"direct": d.Driver != nil && d.Driver.Cache == "none"}}),
				"-blockdev", jsonArg(t, map[string]any{"driver": "raw", "node-name": node, "file": "file-" + dev,
					"offset": s.Offset, "size": s.Size}))
		default:
			t.Fatalf("disk %s: neither an NBD disk nor a block slice: %+v", dev, d.Source)
		}
		device := []string{"virtio-blk-pci", "drive=" + node, "id=" + dev}
		if d.Serial != "" {
			device = append(device, "serial="+d.Serial)
		}
		if d.Shareable != nil {
			device = append(device, "share-rw=on")
		}
		out[dev] = append(args, "-device", strings.Join(device, ","))
	}
	return out
}
