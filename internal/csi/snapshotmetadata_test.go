package csi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/quiverstorage/quiver/internal/nbdclient"
)

const (
	kib = int64(1) << 10
	mib = int64(1) << 20
)

// metaRange is a BlockMetadata as a comparable value.
type metaRange struct{ off, n int64 }

// metaMessage is one message of a SnapshotMetadata stream.
type metaMessage struct {
	typ      csi.BlockMetadataType
	capacity int64
	ranges   []metaRange
}

// recvAll reads a SnapshotMetadata stream to its end.
func recvAll[M interface {
	GetBlockMetadataType() csi.BlockMetadataType
	GetVolumeCapacityBytes() int64
	GetBlockMetadata() []*csi.BlockMetadata
}](recv func() (M, error)) ([]metaMessage, error) {
	var out []metaMessage
	for {
		m, err := recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		msg := metaMessage{typ: m.GetBlockMetadataType(), capacity: m.GetVolumeCapacityBytes()}
		for _, b := range m.GetBlockMetadata() {
			msg.ranges = append(msg.ranges, metaRange{b.GetByteOffset(), b.GetSizeBytes()})
		}
		out = append(out, msg)
	}
}

// from is what a stream from starting offset s must hold of ranges: none
// ending at or before s, the one holding s cut to start there.
func from(ranges []metaRange, s int64) []metaRange {
	var out []metaRange
	for _, r := range ranges {
		if r.off+r.n <= s {
			continue
		}
		if r.off < s {
			r = metaRange{s, r.off + r.n - s}
		}
		out = append(out, r)
	}
	return out
}

// checkStream checks a stream's messages against the spec and want: every
// message VARIABLE_LENGTH with the capacity, at most max ranges (exactly
// max but in the last when max > 0, so the split is the plugin's doing),
// the ranges in order, apart and equal to want.
func checkStream(t *testing.T, what string, msgs []metaMessage, capacity int64, max int, want []metaRange) {
	t.Helper()
	if len(msgs) == 0 {
		t.Errorf("%s: no message; want at least one, with the capacity", what)
		return
	}
	var got []metaRange
	for i, m := range msgs {
		if m.typ != csi.BlockMetadataType_VARIABLE_LENGTH || m.capacity != capacity {
			t.Errorf("%s: message %d: type %v capacity %d, want VARIABLE_LENGTH %d", what, i, m.typ, m.capacity, capacity)
		}
		if max > 0 && (len(m.ranges) > max || i < len(msgs)-1 && len(m.ranges) != max) {
			t.Errorf("%s: message %d of %d holds %d ranges, max_results %d", what, i, len(msgs), len(m.ranges), max)
		}
		got = append(got, m.ranges...)
	}
	for i := 1; i < len(got); i++ {
		if got[i-1].off+got[i-1].n > got[i].off {
			t.Errorf("%s: range %v overlaps or precedes %v", what, got[i], got[i-1])
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s: ranges %v\nwant %v", what, got, want)
	}
}

// TestSnapshotMetadata writes known ranges through NBD between two
// snapshots of a real server and reads them back over gRPC with
// GetMetadataDelta and GetMetadataAllocated, from several starting offsets
// and with several max_results, as the spec defines them.
func TestSnapshotMetadata(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	s := startServer(t)
	p := startPlugin(t, s, "node-x", true)
	ctx := t.Context()
	meta := csi.NewSnapshotMetadataClient(p.conn)

	caps, err := p.ident.GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	advertised := false
	for _, c := range caps.GetCapabilities() {
		advertised = advertised || c.GetService().GetType() == csi.PluginCapability_Service_SNAPSHOT_METADATA_SERVICE
	}
	if !advertised {
		t.Errorf("plugin capabilities %v lack SNAPSHOT_METADATA_SERVICE", caps.GetCapabilities())
	}

	vc := blockCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	resp, err := p.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-meta", VolumeCapabilities: []*csi.VolumeCapability{vc},
		Parameters: map[string]string{"disks": "root=4Mi,data=2Mi"}, CapacityRange: &csi.CapacityRange{RequiredBytes: 8 * mib}})
	if err != nil {
		t.Fatal(err)
	}
	volID := resp.GetVolume().GetVolumeId()
	pub, err := p.ctrl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: volID, NodeId: "node-x", VolumeCapability: vc})
	if err != nil {
		t.Fatal(err)
	}
	dial := func(disk string) *nbdclient.Conn {
		pc := pub.GetPublishContext()
		c, err := nbdclient.Dial(ctx, s.nbdSocket, pc[PublishExportVolume]+"/"+disk+"/"+pc[PublishToken], nbdclient.Options{Timeout: 10 * time.Second,
			Dial: func(ctx context.Context, _, addr string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", addr)
			}})
		if err != nil {
			t.Fatalf("NBD %s: %v", disk, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	root, data := dial("root"), dial("data")
	write := func(c *nbdclient.Conn, off, n int64) {
		t.Helper()
		if err := c.WriteAt(bytes.Repeat([]byte{0x5a}, int(n)), off, true); err != nil {
			t.Fatal(err)
		}
	}
	snapshot := func(name string) string {
		t.Helper()
		r, err := p.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: volID})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetSnapshot().GetSnapshotId()
	}

	write(root, 0, 64*kib)
	write(root, mib, 128*kib)
	a := snapshot("snap-a")
	write(root, 320*kib, 64*kib)
	write(root, 2*mib, 192*kib)
	write(root, 3*mib+100*kib, 4*kib) // one 64 KiB granule of change tracking
	write(data, 0, mib)               // another disk: not the device's
	b := snapshot("snap-b")
	write(root, 3*mib+512*kib, 64*kib) // after b: in neither

	delta := []metaRange{{320 * kib, 64 * kib}, {2 * mib, 192 * kib}, {3*mib + 64*kib, 64 * kib}}
	allocA := []metaRange{{0, 64 * kib}, {mib, 128 * kib}}
	allocB := []metaRange{{0, 64 * kib}, {320 * kib, 64 * kib}, {mib, 128 * kib}, {2 * mib, 192 * kib}, {3*mib + 100*kib, 4 * kib}}
	offsets := []int64{0, 1, 320 * kib, 330 * kib, 384 * kib, mib + 64*kib, 2*mib + 192*kib, 3*mib + 100*kib, 4*mib - 512, 4 * mib}
	for _, max := range []int{0, 1, 2, 3} {
		for _, off := range offsets {
			stream, err := meta.GetMetadataDelta(ctx, &csi.GetMetadataDeltaRequest{BaseSnapshotId: a, TargetSnapshotId: b,
				StartingOffset: off, MaxResults: int32(max)})
			if err != nil {
				t.Fatal(err)
			}
			msgs, err := recvAll(stream.Recv)
			if err != nil {
				t.Fatalf("GetMetadataDelta %s..%s from %d, max %d: %v", a, b, off, max, err)
			}
			checkStream(t, fmt.Sprintf("delta from %d max %d", off, max), msgs, 4*mib, max, from(delta, off))

			for snap, want := range map[string][]metaRange{a: allocA, b: allocB} {
				stream, err := meta.GetMetadataAllocated(ctx, &csi.GetMetadataAllocatedRequest{SnapshotId: snap,
					StartingOffset: off, MaxResults: int32(max)})
				if err != nil {
					t.Fatal(err)
				}
				msgs, err := recvAll(stream.Recv)
				if err != nil {
					t.Fatalf("GetMetadataAllocated %s from %d, max %d: %v", snap, off, max, err)
				}
				checkStream(t, fmt.Sprintf("allocated %s from %d max %d", snap, off, max), msgs, 4*mib, max, from(want, off))
			}
		}
	}
	// The order of the two does not change what differs.
	stream, err := meta.GetMetadataDelta(ctx, &csi.GetMetadataDeltaRequest{BaseSnapshotId: b, TargetSnapshotId: a})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := recvAll(stream.Recv)
	if err != nil {
		t.Fatalf("GetMetadataDelta %s..%s: %v", b, a, err)
	}
	checkStream(t, "delta from b to a", msgs, 4*mib, 0, delta)
	// The delta is the API's (and the CLI's) for the device's disk.
	ch, err := s.api.SnapshotChanges(ctx, volID, "snap-a", "snap-b")
	if err != nil {
		t.Fatal(err)
	}
	var fromAPI []metaRange
	for _, r := range ch.Disks[0].Ranges {
		fromAPI = append(fromAPI, metaRange{r.Offset, r.Length})
	}
	if ch.Disks[0].Disk != "root" || fmt.Sprint(fromAPI) != fmt.Sprint(delta) {
		t.Errorf("API changes of %s: %v, want %v", ch.Disks[0].Disk, fromAPI, delta)
	}

	t.Run("bad input", func(t *testing.T) {
		deltaErr := func(base, target string, off int64, max int32) error {
			stream, err := meta.GetMetadataDelta(ctx, &csi.GetMetadataDeltaRequest{BaseSnapshotId: base, TargetSnapshotId: target,
				StartingOffset: off, MaxResults: max})
			if err != nil {
				return err
			}
			_, err = recvAll(stream.Recv)
			return err
		}
		allocErr := func(snap string, off int64, max int32) error {
			stream, err := meta.GetMetadataAllocated(ctx, &csi.GetMetadataAllocatedRequest{SnapshotId: snap, StartingOffset: off, MaxResults: max})
			if err != nil {
				return err
			}
			_, err = recvAll(stream.Recv)
			return err
		}
		other, err := p.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "pvc-meta-other", VolumeCapabilities: []*csi.VolumeCapability{vc}})
		if err != nil {
			t.Fatal(err)
		}
		r, err := p.ctrl.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: "snap-other", SourceVolumeId: other.GetVolume().GetVolumeId()})
		if err != nil {
			t.Fatal(err)
		}
		elsewhere := r.GetSnapshot().GetSnapshotId()

		wantCode(t, "allocated without snapshot_id", allocErr("", 0, 0), codes.InvalidArgument, "snapshot_id")
		wantCode(t, "allocated of an unknown snapshot", allocErr(volID+"@nope", 0, 0), codes.NotFound, "nope")
		wantCode(t, "allocated of a malformed ID", allocErr("not an id", 0, 0), codes.NotFound, "not an id")
		wantCode(t, "allocated from a negative offset", allocErr(b, -1, 0), codes.OutOfRange, "starting_offset")
		wantCode(t, "allocated from past the end", allocErr(b, 4*mib+1, 0), codes.OutOfRange, "starting_offset")
		wantCode(t, "allocated with negative max_results", allocErr(b, 0, -1), codes.InvalidArgument, "max_results")

		wantCode(t, "delta without base", deltaErr("", b, 0, 0), codes.InvalidArgument, "base_snapshot_id")
		wantCode(t, "delta without target", deltaErr(a, "", 0, 0), codes.InvalidArgument, "target_snapshot_id")
		wantCode(t, "delta from an unknown base", deltaErr(volID+"@nope", b, 0, 0), codes.NotFound, "base_snapshot_id")
		wantCode(t, "delta to an unknown target", deltaErr(a, volID+"@nope", 0, 0), codes.NotFound, "target_snapshot_id")
		wantCode(t, "delta from a malformed base", deltaErr("x@", b, 0, 0), codes.NotFound, "x@")
		wantCode(t, "delta of one snapshot", deltaErr(a, a, 0, 0), codes.InvalidArgument, "same snapshot")
		wantCode(t, "delta across volumes", deltaErr(elsewhere, b, 0, 0), codes.InvalidArgument, "different volumes")
		wantCode(t, "delta from past the end", deltaErr(a, b, 4*mib+512, 0), codes.OutOfRange, "starting_offset")
		wantCode(t, "delta from a negative offset", deltaErr(a, b, -512, 0), codes.OutOfRange, "starting_offset")
		wantCode(t, "delta with negative max_results", deltaErr(a, b, 0, -5), codes.InvalidArgument, "max_results")

		// A checkpoint whose record is lost (as a snapshot from before
		// change tracking): no delta, the spec's "changed block tracking
		// is not enabled", so the caller backs up in full.
		write(root, 0, 4*kib)
		c := snapshot("snap-c")
		dir := filepath.Join(s.pool, "volumes", volID, "changes")
		es, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		last := uint64(0) // the highest sequence number sealed: snap-c's
		for _, e := range es {
			if seq, err := strconv.ParseUint(strings.TrimPrefix(e.Name(), "root."), 10, 64); err == nil {
				last = max(last, seq)
			}
		}
		if last == 0 {
			t.Fatalf("no sealed change epoch of root in %s", dir)
		}
		if err := os.Remove(filepath.Join(dir, fmt.Sprintf("root.%d", last))); err != nil {
			t.Fatal(err)
		}
		wantCode(t, "delta over a lost checkpoint", deltaErr(b, c, 0, 0), codes.FailedPrecondition, "change-tracking checkpoint")
		// What needs no change tracking still answers.
		if err := allocErr(c, 0, 0); err != nil {
			t.Errorf("allocated of %s: %v", c, err)
		}
	})
}
