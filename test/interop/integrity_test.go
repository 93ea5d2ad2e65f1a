package interop

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/quiverstorage/quiver/internal/testserver"
)

// TestConcurrentQemuIO is acceptance criterion 2 with qemu-io: eight
// connections at once, each owning interleaved blocks, write a pattern
// unique to each (connection, request) with up to sixteen requests in
// flight per connection, flush, and read every block back with pattern
// verification; over three rounds that each overwrite every block with a
// new pattern. Blocks are 64 KiB + 512 bytes, so neighbouring blocks of
// different connections share a 4 KiB page. Afterwards the image file must
// hold the last round's pattern in every block. Zero mismatches.
func TestConcurrentQemuIO(t *testing.T) {
	t.Parallel()
	requireTools(t, "qemu-io")
	s := startServer(t)
	const (
		conns  = 8
		reqs   = 31 // per connection and round: 8 * 31 = 248 patterns, all distinct
		rounds = 3
		block  = 64*kiB + 512
		size   = conns * reqs * block
	)
	v := s.createVolume(t, "conc", disk("d", size))
	// pattern is never 0, and differs from the previous round's pattern of
	// the same block.
	pattern := func(c, j, r int) byte { return byte(1 + (c*reqs+j+r*97)%255) }
	offset := func(c, j int) int64 { return int64(j*conns+c) * block }

	var wg sync.WaitGroup
	errs := make([]string, conns)
	for c := range conns {
		uri := s.URI("conc/d")
		if c%2 == 1 {
			uri = s.UnixURI("conc/d")
		}
		rng := rand.New(rand.NewPCG(uint64(c), 7))
		var cmds []string
		for r := range rounds {
			order := rng.Perm(reqs) // submission order differs per round
			for _, j := range order {
				cmds = append(cmds, fmt.Sprintf("aio_write -P 0x%02x %d %d", pattern(c, j, r), offset(c, j), block))
			}
			cmds = append(cmds, "aio_flush", "flush")
			for _, j := range rng.Perm(reqs) {
				cmds = append(cmds, fmt.Sprintf("aio_read -P 0x%02x %d %d", pattern(c, j, r), offset(c, j), block))
			}
			cmds = append(cmds, "aio_flush")
		}
		wg.Go(func() {
			out, err := exe(t.Context(), "qemu-io", qemuIOArgs(uri, false, cmds)...)
			switch {
			case err != nil:
				errs[c] = fmt.Sprintf("%v\n%s", err, out)
			case qemuIOFailure(out) != "":
				errs[c] = fmt.Sprintf("%s\n%s", qemuIOFailure(out), out)
			default:
				wrote, read := strings.Count(out, "wrote "), strings.Count(out, "read ")
				if wrote != rounds*reqs || read != rounds*reqs {
					errs[c] = fmt.Sprintf("%d writes and %d reads completed, want %d each\n%s", wrote, read, rounds*reqs, out)
				}
			}
		})
	}
	wg.Wait()
	for c, e := range errs {
		if e != "" {
			t.Errorf("connection %d: %s", c, testserver.Tail(e, 40))
		}
	}

	img, err := os.ReadFile(diskPath(t, v.Disks, "d"))
	if err != nil {
		t.Fatal(err)
	}
	bad := 0
	for c := range conns {
		for j := range reqs {
			want, off := pattern(c, j, rounds-1), offset(c, j)
			for i, b := range img[off : off+block] {
				if b != want {
					bad++
					if bad <= 10 {
						t.Errorf("block %d (connection %d, request %d): byte %d is %#x, want %#x",
							j*conns+c, c, j, off+int64(i), b, want)
					}
					break
				}
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d blocks hold the wrong pattern in the image file", bad, conns*reqs)
	}
}

// fioJob is the part of a job of fio's JSON output the test checks.
type fioJob struct {
	Name  string `json:"jobname"`
	Error int    `json:"error"`
	Write struct {
		Bytes int64 `json:"io_bytes"`
	} `json:"write"`
	Read struct {
		Bytes int64 `json:"io_bytes"`
	} `json:"read"`
}

// TestFioVerify is acceptance criterion 2 with fio's nbd engine: seven
// jobs, one connection each, iodepth 16, write random blocks of 512 bytes,
// 3.5 KiB (unaligned), 4 KiB, 64 KiB and 1 MiB to disjoint regions of one
// disk, each block carrying a header with its offset and a crc32c, then
// read every block back and verify it (one job verifies while it writes).
// Every job must end without error and read back all it wrote.
func TestFioVerify(t *testing.T) {
	t.Parallel()
	requireTools(t, "fio")
	s := startServer(t)
	s.createVolume(t, "fio", disk("d", 128*miB))
	out := filepath.Join(t.TempDir(), "fio.json")
	args := []string{
		"--output-format=json", "--output=" + out,
		// Global options, for every job below.
		"--ioengine=nbd", "--uri=" + s.URI("fio/d"), "--rw=randwrite", "--iodepth=16",
		"--verify=crc32c", "--verify_fatal=1", "--do_verify=1",
		// fio saves verify state files in the working directory; keep them
		// out of the source tree.
		"--verify_state_save=0",
		"--name=b512", "--bs=512", "--offset=0", "--size=2m",
		"--name=b4k", "--bs=4k", "--offset=2m", "--size=8m", "--numjobs=2", "--offset_increment=8m",
		"--name=b3584", "--bs=3584", "--offset=18m", "--size=7m",
		"--name=b64k", "--bs=64k", "--offset=32m", "--size=32m", "--verify_backlog=16",
		"--name=b1m", "--bs=1m", "--offset=64m", "--size=32m", "--numjobs=2", "--offset_increment=32m",
	}
	stdout, runErr := exe(t.Context(), "fio", args...)
	report, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("fio wrote no report: %v (fio: %v)\n%s", err, runErr, stdout)
	}
	var res struct {
		Jobs []fioJob `json:"jobs"`
	}
	if err := json.Unmarshal(report, &res); err != nil {
		t.Fatalf("fio report: %v\n%s", err, report)
	}
	if runErr != nil {
		t.Errorf("%v\n%s", runErr, stdout)
	}
	if len(res.Jobs) != 7 {
		t.Errorf("fio ran %d jobs, want 7", len(res.Jobs))
	}
	for i, j := range res.Jobs {
		if j.Error != 0 {
			t.Errorf("fio job %d (%s): error %d", i, j.Name, j.Error)
		}
		if j.Write.Bytes == 0 || j.Read.Bytes != j.Write.Bytes {
			t.Errorf("fio job %d (%s): wrote %d bytes, verified %d", i, j.Name, j.Write.Bytes, j.Read.Bytes)
		}
	}
	t.Logf("fio: %d jobs, zero verify errors", len(res.Jobs))
}
