package pool

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// attachVM makes a volume with disks root and data (and a shared disk
// quorum) and returns it.
func attachVM(t *testing.T, p *Pool) *Volume {
	t.Helper()
	mustCreate(t, p, VolumeSpec{Name: "vm", Capacity: 64 * mib, Disks: []DiskSpec{
		{Name: "root", Size: 8 * mib}, {Name: "data", Size: 8 * mib}, {Name: "quorum", Size: mib, Shared: true}}})
	v, err := p.Volume("vm")
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func mustAttach(t *testing.T, v *Volume, node, mode string) *Attachment {
	t.Helper()
	info, _, err := v.Attach(node, mode)
	if err != nil {
		t.Fatal(err)
	}
	a, err := v.AttachmentByToken(info.Token)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func mustOpen(t *testing.T, a *Attachment, disk string) Disk {
	t.Helper()
	d, err := a.OpenDisk(disk)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func mustOpenImplicit(t *testing.T, v *Volume, peer string) Disk {
	t.Helper()
	d, _, err := v.OpenImplicit(peer, "root")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return d
}

func readBack(t *testing.T, d Disk, off int64, n int) []byte {
	t.Helper()
	p := make([]byte, n)
	if err := d.ReadAt(p, off); err != nil {
		t.Fatal(err)
	}
	return p
}

func pattern(b byte, n int) []byte { return bytes.Repeat([]byte{b}, n) }

func TestAttachIsIdempotentByNodeAndKey(t *testing.T) {
	p := openTestPool(t, t.TempDir())
	v := attachVM(t, p)
	key := Idempotency{Key: "publish-node-a"}
	a, created, err := v.AttachWith("node-a", "", key)
	if err != nil || !created || a.Mode != ModeReadWrite || len(a.Token) != 64 {
		t.Fatalf("attach: %+v created=%v err=%v", a, created, err)
	}
	again, created, err := v.AttachWith("node-a", "rw", key)
	if err != nil || created || again.ID != a.ID || again.Token != a.Token {
		t.Fatalf("attach again: %+v created=%v err=%v", again, created, err)
	}
	if _, _, err := v.AttachWith("node-a", "ro", key); !errors.Is(err, ErrExists) {
		t.Fatalf("other mode: %v, want ErrExists", err)
	}
	for _, bad := range [][2]string{{"", "rw"}, {"Node_A", "rw"}, {"node-b", "rx"}, {"../x", "rw"}} {
		if _, _, err := v.Attach(bad[0], bad[1]); !errors.Is(err, ErrInvalid) {
			t.Errorf("attach %q %q: %v, want ErrInvalid", bad[0], bad[1], err)
		}
	}
	if _, err := v.AttachmentByToken("not-a-token"); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("bad token: %v", err)
	}
	if list := v.Attachments(); len(list) != 1 || list[0].Token != "" {
		t.Fatalf("list: %+v", list)
	}
}

// TestMigrationSequence follows what QEMU does during a live migration: the
// destination connects and reads, the source writes last and flushes, the
// destination's first write takes the writer role; the source is fenced and
// its last FLUSH on quit succeeds.
func TestMigrationSequence(t *testing.T) {
	p := openTestPool(t, t.TempDir())
	v := attachVM(t, p)
	src := mustAttach(t, v, "src", "rw")
	srcRoot, srcData := mustOpen(t, src, "root"), mustOpen(t, src, "data")
	if err := srcRoot.WriteAt(pattern(1, 4096), 0, false); err != nil {
		t.Fatal(err)
	}
	if w := v.Writer(); w.Epoch != 1 || w.Writer != src.ID() {
		t.Fatalf("after source write: %+v", w)
	}
	dst := mustAttach(t, v, "dst", "rw")
	dstRoot, dstData := mustOpen(t, dst, "root"), mustOpen(t, dst, "data")
	if got := readBack(t, dstRoot, 0, 512); !bytes.Equal(got, pattern(1, 512)) {
		t.Fatal("destination does not read the source's write")
	}
	// The source goes on writing while the destination only reads.
	if err := srcData.WriteAt(pattern(2, 4096), 0, false); err != nil {
		t.Fatal(err)
	}
	if err := srcData.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := dstData.WriteAt(pattern(3, 4096), 4096, false); err != nil {
		t.Fatal(err)
	}
	if w := v.Writer(); w.Epoch != 2 || w.Writer != dst.ID() {
		t.Fatalf("after destination write: %+v", w)
	}
	for name, d := range map[string]Disk{"root": srcRoot, "data": srcData} {
		if err := d.WriteAt(pattern(9, 4096), 0, true); !errors.Is(err, ErrFenced) {
			t.Fatalf("source write to %s after the switch: %v, want ErrFenced", name, err)
		}
		if err := d.Trim(0, 4096, false); !errors.Is(err, ErrFenced) {
			t.Fatalf("source trim: %v", err)
		}
		if err := d.Zero(0, 4096, 0); !errors.Is(err, ErrFenced) {
			t.Fatalf("source zero: %v", err)
		}
		if err := d.Flush(); err != nil {
			t.Fatalf("fenced flush: %v, want success", err)
		}
	}
	if got := readBack(t, dstRoot, 0, 4096); !bytes.Equal(got, pattern(1, 4096)) {
		t.Fatal("a fenced write changed root")
	}
	if got := readBack(t, dstData, 0, 4096); !bytes.Equal(got, pattern(2, 4096)) {
		t.Fatal("a fenced write changed data")
	}
	// Reads still work through the fenced attachment.
	if got := readBack(t, srcData, 4096, 4096); !bytes.Equal(got, pattern(3, 4096)) {
		t.Fatal("fenced attachment cannot read")
	}
	if info, _ := v.Attachment(src.ID()); !info.Fenced || info.Writer {
		t.Fatalf("source info %+v", info)
	}
	// The shared disk is exempt: both may write it.
	for _, a := range []*Attachment{src, dst} {
		q := mustOpen(t, a, "quorum")
		if err := q.WriteAt(pattern(7, 512), 0, false); err != nil {
			t.Fatalf("shared disk write by %s: %v", a.ID(), err)
		}
	}
	// The destination stays the writer, and an older attachment's write
	// never claims the role back.
	if w := v.Writer(); w.Epoch != 2 || w.Writer != dst.ID() {
		t.Fatalf("end: %+v", w)
	}
}

// TestCancelledMigrationKeepsSource: a destination that attaches and reads
// but never writes leaves the source writing; detaching it changes nothing.
func TestCancelledMigrationKeepsSource(t *testing.T) {
	p := openTestPool(t, t.TempDir())
	v := attachVM(t, p)
	src := mustAttach(t, v, "src", "rw")
	root := mustOpen(t, src, "root")
	if err := root.WriteAt(pattern(1, 4096), 0, false); err != nil {
		t.Fatal(err)
	}
	dst := mustAttach(t, v, "dst", "rw")
	readBack(t, mustOpen(t, dst, "root"), 0, 512)
	if err := v.Detach(dst.ID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-dst.Done():
	default:
		t.Fatal("Done not closed by Detach")
	}
	for i := range 10 {
		if err := root.WriteAt(pattern(byte(i), 4096), int64(i)*4096, false); err != nil {
			t.Fatalf("source write %d after the cancel: %v", i, err)
		}
	}
	if w := v.Writer(); w.Epoch != 1 || w.Writer != src.ID() {
		t.Fatalf("writer %+v", w)
	}
}

// TestOlderAttachmentCannotTakeOver: once a newer attachment writes, an older
// one that never wrote is fenced too, and its first write fails.
func TestOlderAttachmentCannotTakeOver(t *testing.T) {
	p := openTestPool(t, t.TempDir())
	v := attachVM(t, p)
	old := mustAttach(t, v, "old", "rw")
	newer := mustAttach(t, v, "new", "rw")
	if err := mustOpen(t, newer, "root").WriteAt(pattern(1, 512), 0, false); err != nil {
		t.Fatal(err)
	}
	if err := mustOpen(t, old, "data").WriteAt(pattern(2, 512), 0, false); !errors.Is(err, ErrFenced) {
		t.Fatalf("older write: %v, want ErrFenced", err)
	}
	// A third attachment, newer than the writer, takes over at its write.
	third := mustAttach(t, v, "third", "rw")
	if err := mustOpen(t, third, "data").WriteAt(pattern(3, 512), 0, false); err != nil {
		t.Fatal(err)
	}
	if w := v.Writer(); w.Epoch != 2 || w.Writer != third.ID() {
		t.Fatalf("writer %+v", w)
	}
	if err := mustOpen(t, newer, "root").WriteAt(pattern(4, 512), 0, false); !errors.Is(err, ErrFenced) {
		t.Fatalf("previous writer: %v, want ErrFenced", err)
	}
}

// TestInFlightWriteIsFenced holds a source write after it has arrived but
// before it passes the gate; the destination takes over meanwhile; the held
// write must then fail and leave the disk unchanged.
func TestInFlightWriteIsFenced(t *testing.T) {
	p := openTestPool(t, t.TempDir())
	v := attachVM(t, p)
	src := mustAttach(t, v, "src", "rw")
	dst := mustAttach(t, v, "dst", "rw")
	srcRoot, dstRoot := mustOpen(t, src, "root"), mustOpen(t, dst, "root")
	if err := srcRoot.WriteAt(pattern(1, 4096), 0, false); err != nil {
		t.Fatal(err)
	}
	arrived, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	p.SetWriteHook(func(att string) {
		if att == src.ID() {
			once.Do(func() { close(arrived); <-release })
		}
	})
	t.Cleanup(func() { p.SetWriteHook(nil) })
	errc := make(chan error, 1)
	go func() { errc <- srcRoot.WriteAt(pattern(0xee, 4096), 0, true) }()
	<-arrived
	if err := dstRoot.WriteAt(pattern(2, 4096), 8192, false); err != nil {
		t.Fatal(err)
	}
	close(release)
	if err := <-errc; !errors.Is(err, ErrFenced) {
		t.Fatalf("in-flight source write: %v, want ErrFenced", err)
	}
	if got := readBack(t, dstRoot, 0, 4096); !bytes.Equal(got, pattern(1, 4096)) {
		t.Fatal("the fenced in-flight write was applied")
	}
}

func TestReadOnlyAttachment(t *testing.T) {
	p := openTestPool(t, t.TempDir())
	v := attachVM(t, p)
	ro := mustAttach(t, v, "backup", "ro")
	for _, name := range []string{"root", "quorum"} {
		d := mustOpen(t, ro, name)
		if !d.ReadOnly() {
			t.Fatal("handle of an ro attachment is not read-only")
		}
		if err := d.WriteAt(pattern(1, 512), 0, false); !errors.Is(err, ErrReadOnly) {
			t.Fatalf("ro write to %s: %v", name, err)
		}
		if err := d.Zero(0, 512, ZeroMayTrim); !errors.Is(err, ErrReadOnly) {
			t.Fatalf("ro zero: %v", err)
		}
	}
	if _, err := v.Transfer(ro.ID()); !errors.Is(err, ErrInvalid) {
		t.Fatalf("transfer to ro: %v", err)
	}
	if w := v.Writer(); w.Epoch != 0 {
		t.Fatalf("an ro attachment changed the epoch: %+v", w)
	}
}

func TestTransferFencesEveryOther(t *testing.T) {
	p := openTestPool(t, t.TempDir())
	v := attachVM(t, p)
	a := mustAttach(t, v, "a", "rw")
	b := mustAttach(t, v, "b", "rw")
	if err := mustOpen(t, b, "root").WriteAt(pattern(1, 512), 0, false); err != nil {
		t.Fatal(err)
	}
	// Give the role back to the older a: b is fenced although newer.
	info, err := v.Transfer(a.ID())
	if err != nil || !info.Writer {
		t.Fatalf("transfer: %+v %v", info, err)
	}
	if err := mustOpen(t, a, "root").WriteAt(pattern(2, 512), 0, false); err != nil {
		t.Fatalf("new writer: %v", err)
	}
	if err := mustOpen(t, b, "root").WriteAt(pattern(3, 512), 0, false); !errors.Is(err, ErrFenced) {
		t.Fatalf("old writer after transfer: %v", err)
	}
	if w := v.Writer(); w.Epoch != 2 || w.Writer != a.ID() {
		t.Fatalf("writer %+v", w)
	}
}

// TestImplicitConnectionsShareTheRole: tokenless connections write together;
// once an explicit rw attachment exists they are read-only, whether they
// connected before it (their writes are refused) or after (their handles
// are read-only), and never take the writer role from it (issue 14: the
// tour's qemu-img convert fenced a node's attachment). With the explicit
// attachment gone, a tokenless connection writes again.
func TestImplicitConnectionsShareTheRole(t *testing.T) {
	p := openTestPool(t, t.TempDir())
	v := attachVM(t, p)
	d1 := mustOpenImplicit(t, v, "127.0.0.1:1")
	d2 := mustOpenImplicit(t, v, "127.0.0.1:2")
	for i, d := range []Disk{d1, d2, d1} {
		if err := d.WriteAt(pattern(byte(i), 512), 0, false); err != nil {
			t.Fatalf("implicit write %d: %v", i, err)
		}
	}
	if w := v.Writer(); w.Epoch != 1 || w.Writer != ImplicitWriter {
		t.Fatalf("writer %+v", w)
	}
	x := mustAttach(t, v, "x", "rw")
	// Read-only as soon as x exists, before x writes.
	if err := d2.WriteAt(pattern(6, 512), 0, false); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("implicit write while an rw attachment exists: %v, want ErrReadOnly", err)
	}
	xd := mustOpen(t, x, "root")
	if err := xd.WriteAt(pattern(5, 512), 0, false); err != nil {
		t.Fatal(err)
	}
	later := mustOpenImplicit(t, v, "127.0.0.1:3")
	if !later.ReadOnly() {
		t.Errorf("a tokenless connection made while an rw attachment exists is not read-only")
	}
	for i, d := range []Disk{later, d1} {
		if err := d.WriteAt(pattern(7, 512), 0, false); !errors.Is(err, ErrReadOnly) {
			t.Fatalf("implicit write %d after the explicit attachment wrote: %v, want ErrReadOnly", i, err)
		}
		if err := d.Zero(0, 512, 0); !errors.Is(err, ErrReadOnly) {
			t.Fatalf("implicit zero %d: %v, want ErrReadOnly", i, err)
		}
	}
	if err := xd.WriteAt(pattern(8, 512), 0, false); err != nil {
		t.Fatalf("the attachment's write after tokenless writes were tried: %v", err)
	}
	if got := readBack(t, later, 0, 512); !bytes.Equal(got, pattern(8, 512)) {
		t.Fatalf("the disk holds %x..., want the attachment's write", got[:4])
	}
	if w := v.Writer(); w.Epoch != 2 || w.Writer != x.ID() {
		t.Fatalf("writer %+v, want %s at epoch 2", w, x.ID())
	}
	states := map[string]string{}
	for _, a := range v.Attachments() {
		states[a.ID] = a.State
	}
	if states[x.ID()] != StateWriter {
		t.Errorf("attachment x: state %q, want writer (%v)", states[x.ID()], states)
	}
	for id, st := range states {
		if id != x.ID() && st != StateReadOnly {
			t.Errorf("implicit %s: state %q, want read-only", id, st)
		}
	}
	if err := v.Detach(x.ID()); err != nil {
		t.Fatal(err)
	}
	if err := mustOpenImplicit(t, v, "127.0.0.1:4").WriteAt(pattern(9, 512), 0, false); err != nil {
		t.Fatalf("tokenless write once the attachment is gone: %v", err)
	}
	// An implicit attachment ends with its last handle.
	n := len(v.Attachments())
	_ = d1.Close()
	if got := len(v.Attachments()); got != n-1 {
		t.Fatalf("attachments %d after closing an implicit connection, want %d", got, n-1)
	}
}

// TestAttachmentsSurviveRestart: epoch, writer, fencing and tokens are
// durable.
func TestAttachmentsSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	p := openTestPool(t, dir)
	v := attachVM(t, p)
	srcInfo, _, _ := v.Attach("src", "rw")
	dstInfo, _, _ := v.Attach("dst", "rw")
	src, _ := v.AttachmentByToken(srcInfo.Token)
	dst, _ := v.AttachmentByToken(dstInfo.Token)
	for _, a := range []*Attachment{src, dst} {
		d, err := a.OpenDisk("root")
		if err != nil {
			t.Fatal(err)
		}
		if err := d.WriteAt(pattern(1, 512), 0, false); err != nil {
			t.Fatal(err)
		}
		_ = d.Close()
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	p2 := openTestPool(t, dir)
	v2, err := p2.Volume("vm")
	if err != nil {
		t.Fatal(err)
	}
	if w := v2.Writer(); w.Epoch != 2 || w.Writer != dstInfo.ID {
		t.Fatalf("writer after restart %+v", w)
	}
	src2, err := v2.AttachmentByToken(srcInfo.Token)
	if err != nil {
		t.Fatal(err)
	}
	if err := mustOpen(t, src2, "data").WriteAt(pattern(2, 512), 0, false); !errors.Is(err, ErrFenced) {
		t.Fatalf("fenced source after restart: %v", err)
	}
	dst2, err := v2.AttachmentByToken(dstInfo.Token)
	if err != nil {
		t.Fatal(err)
	}
	if err := mustOpen(t, dst2, "data").WriteAt(pattern(3, 512), 0, false); err != nil {
		t.Fatalf("writer after restart: %v", err)
	}
	// A new attachment still gets a newer sequence number than both.
	third := mustAttach(t, v2, "third", "rw")
	if err := mustOpen(t, third, "root").WriteAt(pattern(4, 512), 0, false); err != nil {
		t.Fatal(err)
	}
	if w := v2.Writer(); w.Epoch != 3 {
		t.Fatalf("epoch %d after a newer claim, want 3", w.Epoch)
	}
}

func TestDetachAndDelete(t *testing.T) {
	p := openTestPool(t, t.TempDir())
	v := attachVM(t, p)
	a := mustAttach(t, v, "a", "rw")
	d := mustOpen(t, a, "root")
	if err := p.Delete(t.Context(), "vm"); !errors.Is(err, ErrInUse) {
		t.Fatalf("delete of an attached volume: %v, want ErrInUse", err)
	}
	if err := v.Detach(a.ID()); err != nil {
		t.Fatal(err)
	}
	if err := d.WriteAt(pattern(1, 512), 0, false); !errors.Is(err, ErrFenced) {
		t.Fatalf("write after detach: %v", err)
	}
	if err := v.Detach(a.ID()); !errors.Is(err, ErrAttachmentNotFound) {
		t.Fatalf("second detach: %v", err)
	}
	if _, err := v.AttachmentByToken(a.token); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("token after detach: %v", err)
	}
	cd, c, err := v.OpenImplicit("peer", "root")
	if err != nil {
		t.Fatal(err)
	}
	defer cd.Close()
	if err := p.Delete(t.Context(), "vm"); err != nil {
		t.Fatalf("delete with only an implicit connection: %v", err)
	}
	select {
	case <-c.Done():
	case <-time.After(time.Second):
		t.Fatal("implicit attachment not ended by delete")
	}
}

// TestDeleteRacingAttach: a delete waiting for in-flight I/O while an
// attachment is made must not delete the volume under it.
func TestDeleteRacingAttach(t *testing.T) {
	p := openTestPool(t, t.TempDir())
	v := attachVM(t, p)
	v.gate.RLock() // an in-flight request: Delete waits for the gate
	errc := make(chan error, 1)
	go func() { errc <- p.Delete(t.Context(), "vm") }()
	time.Sleep(50 * time.Millisecond) // let Delete reach the gate
	a, _, err := v.Attach("n1", "rw")
	v.gate.RUnlock()
	if err != nil {
		// Delete won the race: the attach was refused.
		if !errors.Is(err, ErrVolumeNotFound) {
			t.Fatalf("attach during delete: %v", err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("delete: %v", err)
		}
		return
	}
	if err := <-errc; !errors.Is(err, ErrInUse) {
		t.Fatalf("delete after an attach succeeded: %v, want ErrInUse", err)
	}
	if _, err := p.Volume("vm"); err != nil {
		t.Fatalf("volume gone after handing out attachment %s: %v", a.ID, err)
	}
	// Once detached, the delete goes through, and then attaching is refused.
	if err := v.Detach(a.ID); err != nil {
		t.Fatal(err)
	}
	if err := p.Delete(t.Context(), "vm"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := v.Attach("n2", "rw"); !errors.Is(err, ErrVolumeNotFound) {
		t.Fatalf("attach to a deleted volume: %v", err)
	}
}

// TestAttachmentsFileIsPrivate: tokens grant writes, so attachments.json is
// readable by its owner only.
func TestAttachmentsFileIsPrivate(t *testing.T) {
	p := openTestPool(t, t.TempDir())
	v := attachVM(t, p)
	if _, _, err := v.Attach("n1", "rw"); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(v.dir, attachmentsFile))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("attachments.json mode %v, want 0600", st.Mode().Perm())
	}
}

// TestReadOnlyAttachmentIsNeverFenced: an ro attachment reads through every
// move of the writer role, and shows as read-only, never fenced (issue 14:
// it was listed as fenced although it read fine).
func TestReadOnlyAttachmentIsNeverFenced(t *testing.T) {
	p := openTestPool(t, t.TempDir())
	v := attachVM(t, p)
	backup := mustAttach(t, v, "backup", ModeReadOnly)
	bd := mustOpen(t, backup, "root")
	a := mustAttach(t, v, "a", ModeReadWrite)
	if err := mustOpen(t, a, "root").WriteAt(pattern(1, 512), 0, false); err != nil {
		t.Fatal(err)
	}
	b := mustAttach(t, v, "b", ModeReadWrite)
	if _, err := v.Transfer(b.ID()); err != nil {
		t.Fatal(err)
	}
	info, err := v.Attachment(backup.ID())
	if err != nil {
		t.Fatal(err)
	}
	if info.Fenced || info.Writer || info.State != StateReadOnly {
		t.Errorf("ro attachment after two moves of the role: %+v, want read-only, not fenced", info)
	}
	if got := readBack(t, bd, 0, 512); !bytes.Equal(got, pattern(1, 512)) {
		t.Errorf("ro attachment reads %x..., want the data", got[:4])
	}
	p.Close()
	p = openTestPool(t, p.Dir())
	v, _ = p.Volume("vm")
	if info, _ := v.Attachment(backup.ID()); info.Fenced || info.State != StateReadOnly {
		t.Errorf("ro attachment after a restart: %+v", info)
	}
}

// TestDestructiveOpsRefuseConnectedWriters: rollback and disk removal fail
// with ErrInUse, changing nothing, while an rw attachment (explicit or
// tokenless) has an open handle, fenced or not; a read-only connection does
// not count; force goes ahead; with the handles closed no force is needed.
func TestDestructiveOpsRefuseConnectedWriters(t *testing.T) {
	ctx := context.Background()
	ops := []struct {
		name string
		run  func(v *Volume, force bool) error
		done func(v *Volume) bool
	}{
		{"rollback", func(v *Volume, force bool) error {
			_, err := v.RollbackWith(ctx, "s", force, nil)
			return err
		}, func(v *Volume) bool {
			d, err := v.OpenDisk("root")
			if err != nil {
				return false
			}
			defer d.Close()
			b := make([]byte, 512)
			return d.ReadAt(b, 0) == nil && bytes.Equal(b, pattern(1, 512))
		}},
		{"remove disk", func(v *Volume, force bool) error {
			_, err := v.RemoveDiskWith(ctx, "data", force)
			return err
		}, func(v *Volume) bool {
			m := v.manifest()
			_, ok := m.disk("data")
			return !ok
		}},
	}
	writers := []struct {
		name string
		open func(t *testing.T, v *Volume) (close func())
	}{
		{"explicit writer", func(t *testing.T, v *Volume) func() {
			d := mustOpen(t, mustAttach(t, v, "node-a", ModeReadWrite), "root")
			return func() { _ = d.Close() }
		}},
		{"fenced attachment", func(t *testing.T, v *Volume) func() {
			old := mustAttach(t, v, "node-a", ModeReadWrite)
			d := mustOpen(t, old, "root")
			if err := d.WriteAt(pattern(3, 512), 512, false); err != nil {
				t.Fatal(err)
			}
			if err := mustOpen(t, mustAttach(t, v, "node-b", ModeReadWrite), "data").WriteAt(pattern(3, 512), 0, false); err != nil {
				t.Fatal(err)
			}
			return func() { _ = d.Close() }
		}},
		{"tokenless", func(t *testing.T, v *Volume) func() {
			d := mustOpenImplicit(t, v, "127.0.0.1:9")
			return func() { _ = d.Close() }
		}},
	}
	for _, op := range ops {
		for _, w := range writers {
			t.Run(op.name+"/"+w.name, func(t *testing.T) {
				p := openTestPool(t, t.TempDir())
				v := attachVM(t, p)
				writeDisk(t, v, "root", 0, pattern(1, 512))
				if _, _, err := v.CreateSnapshot(ctx, "s", nil); err != nil {
					t.Fatal(err)
				}
				writeDisk(t, v, "root", 0, pattern(2, 512))
				closeWriter := w.open(t, v)
				mustOpen(t, mustAttach(t, v, "reader", ModeReadOnly), "root") // never counts
				err := op.run(v, false)
				if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "force") {
					t.Fatalf("with a connected writer: %v, want ErrInUse saying how to force it", err)
				}
				if op.done(v) {
					t.Fatalf("refused, but done anyway")
				}
				closeWriter()
				if w.name == "explicit writer" {
					// Closed: nothing is connected, no force needed.
					if err := op.run(v, false); err != nil {
						t.Fatalf("with the writer gone: %v", err)
					}
				} else if err := op.run(v, true); err != nil {
					t.Fatalf("forced: %v", err)
				}
				if !op.done(v) {
					t.Fatalf("not done")
				}
			})
		}
	}
}
