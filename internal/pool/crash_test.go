package pool

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/storage/crashfs"
)

// Crash tests: every metadata operation runs on the strict crash twin
// (internal/storage/crashfs), power is cut right before and right after each
// of its sync points in turn, and the pool is reopened on what survived. The
// pool must open; every volume must be as it was before the operation or as
// the operation left it (absent counts), whole, never a mix; an operation
// that returned success must be complete; and nothing of the operation's
// work may be left over (staging, temporary files, a rollback record).
// docs/durability.md lists the sync points and the test that needs each.

// crashDisk is the size of the crash tests' disks.
const crashDisk = 256 << 10

// crashPool opens a pool on the twin.
func crashPool(t *testing.T, cfs *crashfs.FS) *Pool {
	t.Helper()
	p, err := OpenWith(context.Background(), "/crash", Options{FS: cfs,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatalf("open the pool on the crash twin: %v", err)
	}
	return p
}

// crashSetup is the state every case starts from: volume a with two disks
// holding flushed data, a snapshot s1 of it, then newer flushed data.
func crashSetup(t *testing.T, p *Pool) {
	t.Helper()
	ctx := context.Background()
	mustCreate(t, p, VolumeSpec{Name: "a", Capacity: 4 * mib, Labels: map[string]string{"app": "x"},
		Disks: []DiskSpec{{Name: "root", Size: crashDisk}, {Name: "data", Size: crashDisk}}})
	v, err := p.Volume("a")
	if err != nil {
		t.Fatal(err)
	}
	writeDisk(t, v, "root", 0, bytes.Repeat([]byte{1}, 8192))
	writeDisk(t, v, "data", 64<<10, bytes.Repeat([]byte{2}, 4096))
	if _, _, err := v.CreateSnapshot(ctx, "s1", nil); err != nil {
		t.Fatal(err)
	}
	writeDisk(t, v, "root", 4096, bytes.Repeat([]byte{3}, 4096))
}

// crashCase is one operation; prepare (optional) runs after the setup and
// before counting, op is what is cut.
type crashCase struct {
	name    string
	prepare func(t *testing.T, p *Pool)
	op      func(p *Pool) error
}

func vol(p *Pool, name string) *Volume {
	v, err := p.Volume(name)
	if err != nil {
		panic(err)
	}
	return v
}

func crashCases() []crashCase {
	ctx := context.Background()
	attach := func(t *testing.T, p *Pool) {
		if _, _, err := vol(p, "a").Attach("node-x", ModeReadWrite); err != nil {
			t.Fatal(err)
		}
	}
	return []crashCase{
		{name: "volume create", op: func(p *Pool) error {
			_, _, err := p.Create(ctx, VolumeSpec{Name: "b", Capacity: 4 * mib,
				Disks: []DiskSpec{{Name: "root", Size: crashDisk}, {Name: "swap", Size: crashDisk}}})
			return err
		}},
		{name: "volume delete", op: func(p *Pool) error { return p.Delete(ctx, "a") }},
		{name: "disk add", op: func(p *Pool) error {
			_, err := vol(p, "a").AddDisk(ctx, DiskSpec{Name: "logs", Size: crashDisk})
			return err
		}},
		{name: "disk grow", op: func(p *Pool) error {
			_, err := vol(p, "a").GrowDisk(ctx, "data", 2*crashDisk)
			return err
		}},
		{name: "disk remove", op: func(p *Pool) error {
			_, err := vol(p, "a").RemoveDisk(ctx, "data")
			return err
		}},
		{name: "snapshot create", op: func(p *Pool) error {
			_, _, err := vol(p, "a").CreateSnapshot(ctx, "s2", nil)
			return err
		}},
		{name: "snapshot delete", op: func(p *Pool) error { return vol(p, "a").DeleteSnapshot(ctx, "s1") }},
		{name: "clone of a snapshot", op: func(p *Pool) error {
			_, err := p.Clone(ctx, CloneRequest{Source: Source{Volume: "a", Snapshot: "s1"}, Names: []string{"c1"}}, nil)
			return err
		}},
		{name: "clone of the live volume", op: func(p *Pool) error {
			_, err := p.Clone(ctx, CloneRequest{Source: Source{Volume: "a"}, Names: []string{"c1"}}, nil)
			return err
		}},
		{name: "bulk clone", op: func(p *Pool) error {
			_, err := p.Clone(ctx, CloneRequest{Source: Source{Volume: "a", Snapshot: "s1"}, Names: []string{"c1", "c2", "c3"}}, nil)
			return err
		}},
		{name: "rollback", op: func(p *Pool) error {
			_, err := vol(p, "a").Rollback(ctx, "s1", nil)
			return err
		}},
		{name: "rollback to a snapshot with another disk set", prepare: func(t *testing.T, p *Pool) {
			if _, err := vol(p, "a").AddDisk(ctx, DiskSpec{Name: "logs", Size: crashDisk}); err != nil {
				t.Fatal(err)
			}
			if _, err := vol(p, "a").RemoveDisk(ctx, "data"); err != nil {
				t.Fatal(err)
			}
		}, op: func(p *Pool) error {
			_, err := vol(p, "a").Rollback(ctx, "s1", nil)
			return err
		}},
		{name: "attach", op: func(p *Pool) error {
			_, _, err := vol(p, "a").Attach("node-x", ModeReadWrite)
			return err
		}},
		{name: "detach", prepare: attach, op: func(p *Pool) error {
			v := vol(p, "a")
			return v.Detach(v.Attachments()[0].ID)
		}},
		{name: "writer claim", prepare: attach, op: func(p *Pool) error {
			v := vol(p, "a")
			v.amu.Lock()
			var a *Attachment
			for _, at := range v.att.byID {
				a = at
			}
			v.amu.Unlock()
			d, err := a.OpenDisk("root")
			if err != nil {
				return err
			}
			defer d.Close()
			// The claim is what is cut: the write puts back what the
			// disk holds, so its data cannot tell the states apart.
			buf := make([]byte, 4096)
			if err := d.ReadAt(buf, 0); err != nil {
				return err
			}
			return d.WriteAt(buf, 0, false)
		}},
		{name: "writer transfer", prepare: func(t *testing.T, p *Pool) {
			attach(t, p)
			if _, _, err := vol(p, "a").Attach("node-y", ModeReadWrite); err != nil {
				t.Fatal(err)
			}
		}, op: func(p *Pool) error {
			v := vol(p, "a")
			for _, at := range v.Attachments() {
				if at.Node == "node-y" {
					_, err := v.Transfer(at.ID)
					return err
				}
			}
			return fmt.Errorf("no attachment of node-y")
		}},
	}
}

// describe is the pool's state, one line per volume, without what differs
// from run to run (UIDs, tokens, times): disks and their content, snapshots
// and theirs, attachments and the writer.
func describe(t *testing.T, p *Pool) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, info := range p.List(nil) {
		var b strings.Builder
		if info.Broken != "" {
			fmt.Fprintf(&b, "BROKEN %s", info.Broken)
			out[info.Name] = b.String()
			continue
		}
		v, err := p.Volume(info.Name)
		if err != nil {
			t.Fatal(err)
		}
		labels := make([]string, 0, len(info.Labels))
		for k, l := range info.Labels {
			labels = append(labels, k+"="+l)
		}
		sort.Strings(labels)
		fmt.Fprintf(&b, "capacity %d labels %v", info.Capacity, labels)
		for _, d := range info.Disks {
			fmt.Fprintf(&b, " disk %s %d %s", d.Name, d.Size, diskHash(t, func() (Disk, error) { return v.OpenDisk(d.Name) }))
		}
		for _, s := range v.Snapshots() {
			fmt.Fprintf(&b, " snap %s", s.Name)
			for _, d := range s.Disks {
				fmt.Fprintf(&b, " %s %d %s", d.Name, d.Size,
					diskHash(t, func() (Disk, error) { return v.OpenSnapshotDisk(s.Name, d.Name) }))
			}
		}
		nodes := map[string]string{}
		var atts []string
		for _, a := range v.Attachments() {
			nodes[a.ID] = a.Node
			atts = append(atts, fmt.Sprintf("%s/%s/%s", a.Node, a.Mode, a.State))
		}
		sort.Strings(atts)
		w := v.Writer()
		fmt.Fprintf(&b, " attachments %v writer %s epoch %d", atts, nodes[w.Writer], w.Epoch)
		out[info.Name] = b.String()
	}
	return out
}

func diskHash(t *testing.T, open func() (Disk, error)) string {
	t.Helper()
	d, err := open()
	if err != nil {
		return "unreadable: " + err.Error()
	}
	defer d.Close()
	buf := make([]byte, d.Size())
	if err := d.ReadAt(buf, 0); err != nil {
		return "unreadable: " + err.Error()
	}
	sum := sha256.Sum256(buf)
	return hex.EncodeToString(sum[:6])
}

// leftovers lists what recovery must have removed: anything in staging,
// temporary files, rollback records.
func leftovers(cfs *crashfs.FS) []string {
	var out []string
	for _, p := range cfs.Tree() {
		base := p[strings.LastIndex(strings.TrimSuffix(p, "/"), "/")+1:]
		if strings.HasPrefix(p, "staging/") && p != "staging/" || strings.HasPrefix(base, ".tmp-") || strings.HasSuffix(p, "/"+rollbackRecordName) {
			out = append(out, p)
		}
	}
	return out
}

// reboot closes p, cuts the power if it is still on, reboots the twin and
// reopens the pool on what survived.
func reboot(t *testing.T, p *Pool, cfs *crashfs.FS) *Pool {
	t.Helper()
	_ = p.Close()
	cfs.CutPower()
	cfs.Reboot()
	return crashPool(t, cfs)
}

// start makes a twin with the setup done and the case prepared, and
// returns it with the pool and the number of syncs so far.
func start(t *testing.T, tc crashCase) (*crashfs.FS, *Pool, int) {
	t.Helper()
	cfs := crashfs.New("/crash")
	p := crashPool(t, cfs)
	crashSetup(t, p)
	if tc.prepare != nil {
		tc.prepare(t, p)
	}
	return cfs, p, len(cfs.Syncs())
}

func TestCrashAtEverySyncPoint(t *testing.T) {
	for _, tc := range crashCases() {
		t.Run(tc.name, func(t *testing.T) {
			// The reference run: the operation completes; what it leaves
			// must survive a power cut right after it returns.
			cfs, p, s0 := start(t, tc)
			before := describe(t, p)
			if err := tc.op(p); err != nil {
				t.Fatalf("the operation fails without a cut: %v", err)
			}
			after := describe(t, p)
			syncs := cfs.Syncs()[s0:]
			// Another operation follows (its syncs must not make anything
			// of the first one's undone work durable), then the cut.
			if _, _, err := p.Create(context.Background(), VolumeSpec{Name: "z", Capacity: mib,
				Disks: []DiskSpec{{Name: "root", Size: crashDisk}}}); err != nil {
				t.Fatalf("the operation after: %v", err)
			}
			p = reboot(t, p, cfs)
			got := describe(t, p)
			if _, ok := got["z"]; !ok {
				t.Errorf("the volume created after the operation is lost")
			}
			delete(got, "z")
			if !sameMaps(got, after) {
				t.Fatalf("a power cut after the operation returned (and another one after it) loses some of it:\nafter the cut %v\nwhen it returned %v", got, after)
			}
			checkDisksDirs(t, p, cfs)
			if l := leftovers(cfs); len(l) > 0 {
				t.Errorf("leftovers after recovery: %v", l)
			}
			_ = p.Close()
			if len(syncs) == 0 {
				t.Fatal("the operation has no sync point")
			}
			var labels []string
			for _, s := range syncs {
				labels = append(labels, s.Label)
			}
			t.Logf("%d sync points: %s", len(syncs), strings.Join(labels, ", "))

			for k := 1; k <= len(syncs); k++ {
				for _, late := range []bool{false, true} {
					cfs, p, s0 := start(t, tc)
					cfs.CutAtSync(s0+k, late)
					err := tc.op(p)
					if !cfs.Off() {
						t.Fatalf("cut at sync %d (%s): the power was never cut; the operation made %d syncs this time",
							k, syncs[k-1].Label, len(cfs.Syncs())-s0)
					}
					p = reboot(t, p, cfs)
					got := describe(t, p)
					where := fmt.Sprintf("cut %s sync %d of %d (%s)", map[bool]string{false: "before", true: "after"}[late],
						k, len(syncs), syncs[k-1].Label)
					for _, name := range union(before, after, got) {
						g, b, a := got[name], before[name], after[name]
						if err == nil && g != a {
							t.Errorf("%s: the operation returned success but volume %q is not as it left it:\n got   %q\n after %q", where, name, g, a)
						} else if g != b && g != a {
							t.Errorf("%s: volume %q is half done:\n got    %q\n before %q\n after  %q", where, name, g, b, a)
						}
					}
					if l := leftovers(cfs); len(l) > 0 {
						t.Errorf("%s: leftovers after recovery: %v", where, l)
					}
					checkDisksDirs(t, p, cfs)
					_ = p.Close()
				}
			}
		})
	}
}

func sameMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func union(ms ...map[string]string) []string {
	var out []string
	for _, m := range ms {
		for k := range m {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// TestCrashDiskWrites: what the data path acknowledged as durable survives
// a power cut at any sync point. A workload of 4 KiB writes through a disk
// handle (some with FUA, some followed by a FLUSH), as NBD runs them, is cut
// before and after each of its syncs, keeping a random subset of the
// unsynced blocks; after the reboot every block holds its last durable
// write (FUA, or followed by a FLUSH that returned) or a later one.
func TestCrashDiskWrites(t *testing.T) {
	const blocks, writes = 16, 40
	type write struct {
		block int
		val   byte
		fua   bool
		flush bool // a Flush follows it
	}
	var work []write
	for i := range writes {
		work = append(work, write{block: (i * 7) % blocks, val: byte(i + 10), fua: i%5 == 0, flush: i%4 == 3})
	}
	// run runs the workload until something fails and returns, per block,
	// the values it may hold after a cut: its last durable one and every
	// later one.
	run := func(d Disk, initial [][]byte) [][]byte {
		allowed := make([][]byte, blocks)
		for b := range blocks {
			allowed[b] = []byte{initial[b][0]}
		}
		var since []write // written since the last durable point
		for _, w := range work {
			allowed[w.block] = append(allowed[w.block], w.val) // may be there from now on
			if err := d.WriteAt(bytes.Repeat([]byte{w.val}, 4096), int64(w.block)*4096, w.fua); err != nil {
				return allowed
			}
			if w.fua {
				allowed[w.block] = []byte{w.val}
				since = slices.DeleteFunc(since, func(s write) bool { return s.block == w.block })
			} else {
				since = append(since, w)
			}
			if w.flush {
				if err := d.Flush(); err != nil {
					return allowed
				}
				for _, s := range since {
					allowed[s.block] = nil
				}
				for _, s := range since {
					allowed[s.block] = []byte{s.val}
				}
				since = since[:0]
			}
		}
		return allowed
	}
	prepare := func(cfs *crashfs.FS) (*Pool, Disk, [][]byte) {
		p := crashPool(t, cfs)
		mustCreate(t, p, VolumeSpec{Name: "a", Capacity: 4 * mib, Disks: []DiskSpec{{Name: "root", Size: blocks * 4096}}})
		v := vol(p, "a")
		initial := make([][]byte, blocks)
		for b := range blocks {
			initial[b] = bytes.Repeat([]byte{byte(b + 1)}, 4096)
			writeDisk(t, v, "root", int64(b)*4096, initial[b])
		}
		d, err := v.OpenDisk("root")
		if err != nil {
			t.Fatal(err)
		}
		return p, d, initial
	}

	cfs := crashfs.New("/crash")
	p, d, initial := prepare(cfs)
	s0 := len(cfs.Syncs())
	run(d, initial)
	syncs := cfs.Syncs()[s0:]
	_ = d.Close()
	_ = p.Close()
	t.Logf("%d sync points", len(syncs))
	// k = 0: the power is cut once the whole workload has returned.
	for k := 0; k <= len(syncs); k++ {
		for _, late := range []bool{false, true} {
			if k == 0 && late {
				continue
			}
			cfs := crashfs.New("/crash")
			p, d, initial := prepare(cfs)
			cfs.KeepPartial(uint64(k))
			if k > 0 {
				cfs.CutAtSync(len(cfs.Syncs())+k, late)
			}
			allowed := run(d, initial)
			_ = d.Close()
			p = reboot(t, p, cfs)
			got := make([]byte, blocks*4096)
			dd, err := vol(p, "a").OpenDisk("root")
			if err != nil {
				t.Fatal(err)
			}
			if err := dd.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			_ = dd.Close()
			for b := range blocks {
				blk := got[b*4096 : (b+1)*4096]
				if !bytes.Equal(blk, bytes.Repeat(blk[:1], 4096)) || !slices.Contains(allowed[b], blk[0]) {
					where := "cut after the workload"
					if k > 0 {
						where = fmt.Sprintf("cut %s sync %d of %d (%s)", map[bool]string{false: "before", true: "after"}[late],
							k, len(syncs), syncs[k-1].Label)
					}
					t.Errorf("%s: block %d holds %d, allowed %v (its last durable write or a later one)", where, b, blk[0], allowed[b])
				}
			}
			_ = p.Close()
		}
	}
}

// checkDisksDirs requires the disks directory of every volume to hold the
// images its manifest lists and nothing else.
func checkDisksDirs(t *testing.T, p *Pool, cfs *crashfs.FS) {
	t.Helper()
	tree := cfs.Tree()
	for _, info := range p.List(nil) {
		if info.Broken != "" {
			continue
		}
		prefix := "volumes/" + info.Name + "/disks/"
		var got, want []string
		for _, e := range tree {
			if strings.HasPrefix(e, prefix) && e != prefix {
				got = append(got, strings.TrimPrefix(e, prefix))
			}
		}
		for _, d := range info.Disks {
			want = append(want, d.Name+".img")
		}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("volume %s: disks directory holds %v, its manifest lists %v", info.Name, got, want)
		}
	}
}
