package interop

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// qemuIO runs one qemu-io process (one NBD connection) with the commands
// and fails the test when it fails. qemu-io exits 0 when an aio_read's
// pattern check fails, so the output is searched for failures too.
func qemuIO(t *testing.T, uri string, readOnly bool, cmds ...string) string {
	t.Helper()
	out, err := exe(t.Context(), "qemu-io", qemuIOArgs(uri, readOnly, cmds)...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if bad := qemuIOFailure(out); bad != "" {
		t.Fatalf("qemu-io on %s: %s\n%s", uri, bad, out)
	}
	return out
}

func qemuIOArgs(uri string, readOnly bool, cmds []string) []string {
	args := []string{"-f", "raw"}
	if readOnly {
		args = append(args, "-r")
	}
	for _, c := range cmds {
		args = append(args, "-c", c)
	}
	return append(args, uri)
}

// qemuIOFailure returns the first line of qemu-io output that reports a
// failure ("Pattern verification failed ...", "aio_write failed: ..."), or
// "".
func qemuIOFailure(out string) string {
	for line := range strings.Lines(out) {
		if strings.Contains(strings.ToLower(line), "failed") {
			return strings.TrimSpace(line)
		}
	}
	return ""
}

// diskModel is what a disk must read as: the test applies each command to
// it as well as to the disk.
type diskModel []byte

func (m diskModel) fill(off, n int64, b byte) {
	for i := off; i < off+n; i++ {
		m[i] = b
	}
}

// runs returns the model as maximal runs of one byte value.
func (m diskModel) runs() []patternRun {
	var out []patternRun
	for i := int64(0); i < int64(len(m)); {
		j := i + 1
		for j < int64(len(m)) && m[j] == m[i] {
			j++
		}
		out = append(out, patternRun{off: i, n: j - i, b: m[i]})
		i = j
	}
	return out
}

type patternRun struct {
	off, n int64
	b      byte
}

// readChecks returns qemu-io commands that read the whole disk and check
// every byte against the model.
func (m diskModel) readChecks() []string {
	var cmds []string
	for _, r := range m.runs() {
		cmds = append(cmds, fmt.Sprintf("read -P 0x%02x %d %d", r.b, r.off, r.n))
	}
	return cmds
}

// TestQemuIOCommands drives every data command qemu's NBD client sends:
// WRITE (plain, FUA, unaligned), WRITE_ZEROES (plain, may-trim, FUA, fast),
// TRIM and FLUSH, each read back at once on the same connection; then the
// whole disk is checked against a model on a fresh connection, read-only,
// and in the image file itself.
func TestQemuIOCommands(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io")
	s := startServer(t)
	const size = 16 * miB
	v := s.createVolume(t, "io", disk("d", size))
	uri := s.URI("io/d")
	model := make(diskModel, size)

	steps := []struct {
		cmd  string // qemu-io command
		off  int64
		n    int64
		fill int // byte the range reads as afterwards; -1: unchanged (flush)
	}{
		{"write -P 0xa1 0 4M", 0, 4 * miB, 0xa1},
		{"write -P 0xa5 8M 1M", 8 * miB, miB, 0xa5},
		{"write -f -P 0xa2 1M 64k", miB, 64 * kiB, 0xa2},            // FUA
		{"write -z 512k 128k", 512 * kiB, 128 * kiB, 0},             // WRITE_ZEROES with NO_HOLE
		{"write -z -u 2M 512k", 2 * miB, 512 * kiB, 0},              // may punch a hole
		{"write -z -f 3M 4k", 3 * miB, 4 * kiB, 0},                  // zeroes with FUA
		{"write -z -u -n 3100k 100k", 3100 * kiB, 100 * kiB, 0},     // FAST_ZERO
		{"discard 1536k 256k", 1536 * kiB, 256 * kiB, 0},            // TRIM: quiver punches, so zeros
		{"discard 8200k 100000", 8200 * kiB, 100000, 0},             // unaligned TRIM
		{"write -P 0xa4 4097 1000", 4097, 1000, 0xa4},               // unaligned, inside one block
		{"write -P 0xa6 4194000 1000", 4194000, 1000, 0xa6},         // across the end of the data
		{"write -f -P 0xa7 16773119 4097", size - 4097, 4097, 0xa7}, // FUA, the last byte
		{"flush", 0, 0, -1},
	}
	var cmds []string
	for _, st := range steps {
		cmds = append(cmds, st.cmd)
		if st.fill < 0 {
			continue
		}
		model.fill(st.off, st.n, byte(st.fill))
		cmds = append(cmds, fmt.Sprintf("read -P 0x%02x %d %d", st.fill, st.off, st.n))
	}
	qemuIO(t, uri, false, cmds...)

	// Reads of 256 KiB and more that span holes get OFFSET_HOLE chunks:
	// check the parts of one such read separately.
	qemuIO(t, uri, true,
		"read -P 0 -s 0 -l 256k 1536k 1536k",        // trimmed
		"read -P 0xa1 -s 256k -l 256k 1536k 1536k",  // data
		"read -P 0 -s 512k -l 512k 1536k 1536k",     // zeroed with may-trim
		"read -P 0xa1 -s 1024k -l 512k 1536k 1536k", // data
		"read -P 0 -s 0 -l 4096 3M 1M",              // zeroed with FUA
		"read -P 0xa1 -s 4096 -l 24576 3M 1M")       // up to the fast zero

	// The whole disk, on a fresh connection, over both transports.
	qemuIO(t, uri, false, model.readChecks()...)
	qemuIO(t, s.UnixURI("io/d"), true, model.readChecks()...)

	// And the image file itself: the server wrote where it was told.
	got, err := os.ReadFile(diskPath(t, v.Disks, "d"))
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(got)) != size {
		t.Fatalf("image file is %d bytes, want %d", len(got), size)
	}
	for _, r := range model.runs() {
		for i := r.off; i < r.off+r.n; i++ {
			if got[i] != r.b {
				t.Fatalf("image file byte %d is %#x, want %#x (run [%d, +%d))", i, got[i], r.b, r.off, r.n)
			}
		}
	}
}

// TestSnapshotExportIsReadOnly checks that a snapshot export reads the data
// of the instant it was taken while the live disk moves on, and refuses
// writes: qemu refuses to open it read-write, and the server itself answers
// WRITE, TRIM and WRITE_ZEROES with EPERM when a client sends them anyway.
func TestSnapshotExportIsReadOnly(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io")
	s := startServer(t)
	const size = 8 * miB
	s.createVolume(t, "vm", disk("root", size))
	live, snap := s.URI("vm/root"), s.URI("vm@before/root")
	qemuIO(t, live, false, "write -P 0x5a 0 1M", "write -P 0x5b 4M 1M", "flush")
	s.snapshot(t, "vm", "before")
	qemuIO(t, live, false, "write -P 0xc3 0 8M", "flush")

	before := []string{"read -P 0x5a 0 1M", "read -P 0 1M 3M", "read -P 0x5b 4M 1M", "read -P 0 5M 3M"}
	qemuIO(t, snap, true, before...)
	qemuIO(t, live, true, "read -P 0xc3 0 8M")

	out := runFails(t, "qemu-io", qemuIOArgs(snap, false, []string{"write -P 0xee 0 4k"})...)
	t.Logf("qemu-io refuses to open the snapshot read-write: %s", strings.TrimSpace(out))

	w := dialExport(t, s.NBDAddr, "vm@before/root")
	if w.flags&nbdFlagReadOnly == 0 {
		t.Errorf("transmission flags %#x: NBD_FLAG_READ_ONLY not set", w.flags)
	}
	for _, c := range []struct {
		name string
		typ  uint16
		data []byte
	}{
		{"WRITE", nbdCmdWrite, make([]byte, 4096)},
		{"TRIM", nbdCmdTrim, nil},
		{"WRITE_ZEROES", nbdCmdWriteZeroes, nil},
	} {
		if errno := w.request(t, c.typ, 0, 4096, c.data); errno != nbdEPERM {
			t.Errorf("%s on a snapshot export: error %d, want EPERM (%d)", c.name, errno, nbdEPERM)
		}
	}
	if errno := w.request(t, nbdCmdFlush, 0, 0, nil); errno != 0 {
		t.Errorf("FLUSH on a snapshot export: error %d, want success", errno)
	}
	w.disconnect(t)
	qemuIO(t, snap, true, before...)
}
