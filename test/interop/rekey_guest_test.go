package interop

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testguest"
	"github.com/quiverstorage/quiver/internal/testserver"
	"github.com/quiverstorage/quiver/test/migration/record"
)

// rekeyGuestDisks are the guest's disks, in the order its writer numbers
// them (record disk 0, 1, 2).
var rekeyGuestDisks = []string{"vda", "vdb", "vdc"}

// TestDeepRekeyUnderAGuest is acceptance 3 of issue 35 with a real guest:
// a Linux guest under QEMU (TCG) writes records to the three disks of an
// encrypted volume through QEMU's NBD client (test/migration's guest
// writer: each record an O_DIRECT|O_SYNC pwrite, so a write and a flush)
// while the volume is deep-rekeyed at a pace that makes the rekey span
// many seconds of the guest's writes. QEMU must report no failed request
// and the console no I/O error; the rekey must end with a new data key
// under a new KEK; then the VM is stopped (every request in flight
// completes) and each disk, read back over NBD, must hold exactly the
// records QEMU completed, every one intact.
func TestDeepRekeyUnderAGuest(t *testing.T) {
	requireTools(t, "qemu-system-x86_64", "qemu-img")
	k, initrd, err := testguest.BuildWriter(t.TempDir(), rekeyGuestDisks)
	if errors.Is(err, testguest.ErrMissing) {
		testfs.SkipOrFail(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	dir := testguest.ShortDir(t, "qrk")
	keys := filepath.Join(t.TempDir(), "keys.json")
	sock := filepath.Join(dir, "nbd.sock")
	s := testserver.StartT(t, quiverBin, testserver.Options{Pool: filepath.Join(t.TempDir(), "pool"), NBDSocket: sock,
		Args: []string{"--key-file", keys}})
	ctx := testguest.Context(t, 5*time.Minute)
	const diskSize = 32 << 20
	spec := api.VolumeSpec{Name: "guest", Capacity: 3 * diskSize, Encrypt: true}
	for _, d := range rekeyGuestDisks {
		spec.Disks = append(spec.Disks, api.DiskSpec{Name: d, Size: diskSize})
	}
	v, err := s.API.CreateVolume(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	console, qmpPath := filepath.Join(dir, "console"), filepath.Join(dir, "qmp")
	args := testguest.Machine{QMP: qmpPath}.Args(k, initrd, console)
	for _, d := range rekeyGuestDisks {
		bd, err := json.Marshal(map[string]any{"driver": "nbd", "node-name": "disk-" + d,
			"server": map[string]string{"type": "unix", "path": sock}, "export": "guest/" + d})
		if err != nil {
			t.Fatal(err)
		}
		args = append(args, "-blockdev", string(bd), "-device", "virtio-blk-pci,drive=disk-"+d+",id="+d)
	}
	out := &testserver.LogBuffer{}
	cmd := exec.Command("qemu-system-x86_64", args...)
	cmd.Stdout, cmd.Stderr = out, out
	vm, err := testguest.StartVM(cmd, console)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		vm.Shutdown()
		if t.Failed() {
			t.Logf("--- guest console ---\n%s\n--- QEMU ---\n%s", testserver.Tail(vm.ConsoleText(), 40), out.String())
		}
	})
	if err := vm.DialQMP(ctx, qmpPath); err != nil {
		t.Fatal(err)
	}
	stats := func() map[string]testguest.BlockStats {
		t.Helper()
		all, err := vm.QMP.BlockStats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		byDisk := map[string]testguest.BlockStats{}
		for _, d := range rekeyGuestDisks {
			st, ok := all["disk-"+d]
			if !ok {
				t.Fatalf("query-blockstats has no disk-%s: %+v", d, all)
			}
			if st.Failed() > 0 {
				t.Fatalf("QEMU failed requests on %s: %+v", d, st)
			}
			byDisk[d] = st
		}
		for _, bad := range testguest.WriterTrouble {
			if strings.Contains(vm.ConsoleText(), bad) {
				t.Fatalf("the guest console says %q", bad)
			}
		}
		return byDisk
	}
	waitWrites := func(more int64) {
		t.Helper()
		base := stats()
		for {
			st, done := stats(), true
			for _, d := range rekeyGuestDisks {
				done = done && st[d].WrOperations >= base[d].WrOperations+more
			}
			if done {
				return
			}
			select {
			case <-ctx.Done():
				t.Fatalf("the guest did not write %d more records: %+v", more, st)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	waitWrites(20)

	// 96 MiB at 4 MiB/s: the rekey paces holes too, so it spans about 24 s.
	job, err := s.API.StartRekey(ctx, "guest", api.RekeySpec{Deep: true, Rate: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	before := stats()
	start := time.Now()
	final, err := s.API.WaitJob(ctx, job.ID, 200*time.Millisecond, func(api.Job) { stats() })
	if err != nil {
		t.Fatal(err)
	}
	if final.State != "succeeded" {
		t.Fatalf("rekey job %s: %s", final.State, final.Error)
	}
	during := stats()
	var n int64
	for _, d := range rekeyGuestDisks {
		n += during[d].WrOperations - before[d].WrOperations
	}
	t.Logf("deep rekey took %v; the guest wrote %d records meanwhile", time.Since(start).Round(time.Millisecond), n)
	if n < 30 {
		t.Fatalf("the guest wrote only %d records during the rekey: it did not overlap", n)
	}
	got, err := s.API.GetVolume(ctx, "guest")
	if err != nil {
		t.Fatal(err)
	}
	if got.Encryption == nil || got.Encryption.Rekey != nil || got.Encryption.KeyID == v.Encryption.KeyID {
		t.Fatalf("after the rekey: encryption %+v (before: KEK %s)", got.Encryption, v.Encryption.KeyID)
	}
	waitWrites(10)
	if err := vm.QMP.Execute(ctx, "stop", nil, nil); err != nil {
		t.Fatal(err)
	}
	final2 := stats()
	img := t.TempDir()
	for i, d := range rekeyGuestDisks {
		path := filepath.Join(img, d+".img")
		if o, err := exe(ctx, "qemu-img", "convert", "-f", "raw", "-O", "raw", "nbd+unix:///guest/"+d+"?socket="+sock, path); err != nil {
			t.Fatalf("%v\n%s", err, o)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		count, err := record.Count(b, uint64(i))
		if err != nil {
			t.Fatalf("disk %s read back over NBD: %v", d, err)
		}
		if count != final2[d].WrOperations {
			t.Errorf("disk %s holds %d records, but QEMU completed %d writes to it", d, count, final2[d].WrOperations)
		}
	}
}
