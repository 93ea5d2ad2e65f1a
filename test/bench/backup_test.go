package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/objstore"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/tests3"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// TestBenchBackup is issue 33's acceptance 5 (make bench-backup): quiver
// backup against restic (Debian's package) on the same bytes and the same
// S3 server, in one run. A 3-disk VM (QUIVER_BENCH_VM_MIB, default 8 GiB:
// root 1/2, data 3/8, logs 1/8) written full through NBD, then 1% changed in
// scattered 4 to 64 KiB writes through NBD. quiver backs the volume up, full
// then incremental, and restores the latest into a new volume; restic backs
// up the same bytes (reflinked copies of the volume's snapshots before and
// after the change, at one path, as a file-level backup of the image files
// would see them), then restores the latest into a directory. Then
// QUIVER_BENCH_CLONES (default 100) clones of a golden volume of one disk
// (QUIVER_BENCH_GOLDEN_MIB, default 1 GiB, written full) are backed up to a
// repository of their own: its bytes after all of them against after the
// first.
//
// The pool and restic's files are on a loop-mounted XFS (reflink, as a
// production pool); the S3 server is tests3 (gofakes3, in memory, in this
// process). The page cache is dropped before each timed step, so each tool
// reads its disks cold. Prints, never asserts.
func TestBenchBackup(t *testing.T) {
	if os.Getenv("QUIVER_BENCH") == "" {
		t.Skip("benchmark: run with make bench-backup")
	}
	for _, tool := range []string{"restic", "cp", "fstrim"} {
		testfs.RequireTool(t, tool)
	}
	vmSize := envMiB(t, "QUIVER_BENCH_VM_MIB", 8192)
	goldenSize := envMiB(t, "QUIVER_BENCH_GOLDEN_MIB", 1024)
	clones := int(envMiB(t, "QUIVER_BENCH_CLONES", 100) >> 20)
	if vmSize%(8*mib) != 0 {
		t.Fatalf("QUIVER_BENCH_VM_MIB=%d: must be a multiple of 8", vmSize>>20)
	}
	// The S3 server keeps every object in this process's heap: collect
	// it often rather than let it double.
	debug.SetGCPercent(20)
	ctx := t.Context()
	mnt := testfs.MountXFS(t, 3*vmSize+4*goldenSize+8*gib) // sparse; fstrim gives back what is deleted
	s3 := tests3.Start(t)
	store, err := objstore.NewS3(ctx, s3.Config)
	if err != nil {
		t.Fatal(err)
	}
	b := newBackupBench(t, mnt, s3)

	disks := []benchDisk{{"root", vmSize / 2}, {"data", vmSize * 3 / 8}, {"logs", vmSize / 8}}
	args := []string{"volume", "create", "vm", "--capacity", strconv.FormatInt(vmSize>>20, 10) + "Mi"}
	for _, d := range disks {
		args = append(args, "--disk", fmt.Sprintf("%s=%dMi", d.name, d.size>>20))
	}
	b.cli(args...)
	start := time.Now()
	fillVolume(t, ctx, b.srv.NBDAddr, "vm", disks, 1)
	t.Logf("wrote %s through NBD in %v", size(vmSize), time.Since(start).Round(time.Millisecond))
	b.cli("snapshot", "create", "vm", "before")

	// quiver: full, change, incremental, restore.
	full := b.quiverBackup(t, "quiver-full", "bench", "vm", "--full")
	full.stored, _ = storeBytes(t, store, "quiver/")
	start = time.Now()
	change := changeVolume(t, ctx, b.srv.NBDAddr, "vm", disks, 0.01, 2)
	t.Logf("changed %s in %d writes (%d distinct 1 MiB chunks) in %v", size(change.bytes), change.writes, change.chunks,
		time.Since(start).Round(time.Millisecond))
	b.cli("snapshot", "create", "vm", "after")
	incr := b.quiverBackup(t, "quiver-incremental", "bench", "vm")
	incr.stored, _ = storeBytes(t, store, "quiver/")
	incr.stored -= full.stored
	if incr.backup.Parent != full.backup.ID {
		t.Fatalf("second backup's parent is %q, want %s: not incremental", incr.backup.Parent, full.backup.ID)
	}
	qRestore := b.timed(t, "quiver-restore", func() { b.cli("backup", "restore", "--target", "bench", incr.backup.ID, "vm-restored") })
	b.cli("volume", "delete", "vm-restored", "--recursive")
	b.trim(t)
	qRepo := full.stored + incr.stored
	deletePrefix(t, store, "quiver/")

	// restic: the same bytes, at one path.
	src := filepath.Join(mnt, "restic-src")
	rfull := b.resticBackup(t, src, "before")
	rfull.stored, _ = storeBytes(t, store, "restic/")
	rincr := b.resticBackup(t, src, "after")
	rincr.stored, _ = storeBytes(t, store, "restic/")
	rincr.stored -= rfull.stored
	target := filepath.Join(mnt, "restic-restore")
	var rRestoreCPU time.Duration
	rRestore := b.timed(t, "restic-restore", func() { _, rRestoreCPU = b.restic(t, "restore", "latest", "--target", target) })
	if err := os.RemoveAll(target); err != nil {
		t.Fatal(err)
	}
	b.trim(t)
	rRepo := rfull.stored + rincr.stored
	deletePrefix(t, store, "restic/")

	// 100 clones of a golden image.
	b.cli("volume", "create", "golden", "--capacity", strconv.FormatInt(goldenSize>>20, 10)+"Mi",
		"--disk", fmt.Sprintf("root=%dMi", goldenSize>>20))
	fillVolume(t, ctx, b.srv.NBDAddr, "golden", []benchDisk{{"root", goldenSize}}, 3)
	b.cli("snapshot", "create", "golden", "v1")
	b.cli("clone", "golden@v1", fmt.Sprintf("vdi-{001..%03d}", clones))
	b.dropCaches(t)
	b.quick = true
	first := b.quiverBackup(t, "quiver-clone", "dedup", "vdi-001")
	one, oneObjects := storeBytes(t, store, "quiver-dedup/")
	cloneStart := time.Now()
	for i := 2; i <= clones; i++ {
		b.quiverBackup(t, "quiver-clone", "dedup", fmt.Sprintf("vdi-%03d", i))
	}
	cloneTook := time.Since(cloneStart)
	all, allObjects := storeBytes(t, store, "quiver-dedup/")

	// The report.
	r := &report{}
	r.add("step", "quiver", "restic", "restic / quiver", "goal")
	r.add(fmt.Sprintf("full backup of %s: time", size(vmSize)), secs(full.took), secs(rfull.took), ratio(rfull.took, full.took), "")
	r.add("full backup: throughput (logical bytes / time)", rate(vmSize, full.took), rate(vmSize, rfull.took),
		fmt.Sprintf("%.2fx", float64(rfull.took)/float64(full.took)),
		"quiver >= 1.0x restic: "+verdict(full.took <= rfull.took))
	r.add("full backup: CPU seconds (tool / S3 server)", cpu(full.cpu, full.s3cpu), cpu(rfull.cpu, rfull.s3cpu), "", "")
	r.add("full backup: bytes read / added to the store", bytesPair(full.backup.Stats.BytesRead, full.stored),
		bytesPair(rfull.summary.TotalBytesProcessed, rfull.stored), "", "")
	r.add(fmt.Sprintf("incremental after %s changed in %d writes: time", size(change.bytes), change.writes),
		secs(incr.took), secs(rincr.took), ratio(rincr.took, incr.took),
		"restic / quiver >= 20x: "+verdict(rincr.took >= 20*incr.took))
	r.add("incremental: CPU seconds (tool / S3 server)", cpu(incr.cpu, incr.s3cpu), cpu(rincr.cpu, rincr.s3cpu), "", "")
	r.add("incremental: bytes read / added to the store", bytesPair(incr.backup.Stats.BytesRead, incr.stored),
		bytesPair(rincr.summary.TotalBytesProcessed, rincr.stored), "", "")
	r.add("restore of the latest: time", secs(qRestore.took), secs(rRestore.took), ratio(rRestore.took, qRestore.took), "")
	r.add("restore: throughput", rate(vmSize, qRestore.took), rate(vmSize, rRestore.took),
		fmt.Sprintf("%.2fx", float64(rRestore.took)/float64(qRestore.took)),
		"quiver >= 1.0x restic: "+verdict(qRestore.took <= rRestore.took))
	r.add("restore: CPU seconds (tool / S3 server)", cpu(qRestore.cpu, qRestore.s3cpu), cpu(rRestoreCPU, rRestore.s3cpu), "", "")
	r.add("repository after both backups", size(qRepo), size(rRepo), fmt.Sprintf("%.2fx", float64(rRepo)/float64(qRepo)), "")
	r.print(os.Stdout, fmt.Sprintf("quiver backup vs restic %s: a 3-disk VM of %s on XFS, S3 on loopback, page cache dropped before each step",
		resticVersion(t), size(vmSize)))

	d := &report{}
	d.add(fmt.Sprintf("%d clones of a %s golden image, each backed up (full)", clones, size(goldenSize)), "repository bytes", "objects", "goal")
	d.add("after the first clone", size(one)+fmt.Sprintf(" (%d B)", one), strconv.Itoa(oneObjects), "")
	d.add(fmt.Sprintf("after all %d", clones), size(all)+fmt.Sprintf(" (%d B)", all), strconv.Itoa(allObjects),
		fmt.Sprintf("%.3fx of one (<= 1.1x: %s)", float64(all)/float64(one), verdict(float64(all) <= 1.1*float64(one))))
	d.add("time: first clone / each later clone (mean)", secs(first.took)+" / "+secs(cloneTook/time.Duration(max(clones-1, 1))), "", "")
	d.print(os.Stdout, "Deduplication across clones")
}

// backupBench is the benchmark's server, S3 and restic repository.
type backupBench struct {
	t      *testing.T
	bin    string
	srv    *testserver.Process
	mnt    string
	env    []string // restic's
	inited bool
	// quick: timed neither drops the page cache nor profiles (the
	// clones' backups: many, short, and the same blocks).
	quick bool
}

func newBackupBench(t *testing.T, mnt string, s3 *tests3.Server) *backupBench {
	dir := t.TempDir()
	bin := filepath.Join(dir, "quiver")
	if err := testserver.Build(bin, false); err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	access, secret := write("access", s3.Config.AccessKey), write("secret", s3.Config.SecretKey)
	var targets []map[string]any
	for _, name := range []string{"bench", "dedup"} {
		key := filepath.Join(dir, name+".key")
		if out, err := exec.Command(bin, "backup", "key", "generate", key).CombinedOutput(); err != nil {
			t.Fatalf("backup key generate: %v\n%s", err, out)
		}
		prefix := "quiver"
		if name == "dedup" {
			prefix = "quiver-dedup"
		}
		targets = append(targets, map[string]any{"name": name, "endpoint": s3.Config.Endpoint, "bucket": s3.Config.Bucket,
			"prefix": prefix, "insecure": true, "accessKeyFile": access, "secretKeyFile": secret, "keyFile": key})
	}
	cfg, _ := json.Marshal(map[string]any{"targets": targets})
	args := []string{"--backup-config", write("backup.json", string(cfg))}
	if os.Getenv("QUIVER_BENCH_PPROF") != "" {
		args = append(args, "--pprof")
	}
	srv := testserver.StartT(t, bin, testserver.Options{Pool: filepath.Join(mnt, "pool"), NBDTCP: true, LogLevel: "warn",
		Args: args})
	b := &backupBench{t: t, bin: bin, srv: srv, mnt: mnt, env: append(os.Environ(),
		"RESTIC_REPOSITORY=s3:http://"+s3.Config.Endpoint+"/"+s3.Config.Bucket+"/restic",
		"AWS_ACCESS_KEY_ID="+s3.Config.AccessKey, "AWS_SECRET_ACCESS_KEY="+s3.Config.SecretKey,
		"RESTIC_PASSWORD=quiver-bench", "RESTIC_CACHE_DIR="+filepath.Join(dir, "restic-cache"))}
	for _, target := range []string{"bench", "dedup"} {
		b.cli("backup", "target", "init", target)
	}
	return b
}

func (b *backupBench) cli(args ...string) []byte {
	b.t.Helper()
	out, err := exec.Command(b.bin, append([]string{"--server", "http://" + b.srv.APIAddr}, args...)...).Output()
	if err != nil {
		msg := ""
		if ee, ok := err.(*exec.ExitError); ok {
			msg = string(ee.Stderr)
		}
		b.t.Fatalf("quiver %s: %v\n%s%s", strings.Join(args, " "), err, out, msg)
	}
	return out
}

// step is one timed step: its wall time, the CPU time of the tool (the
// quiver server, or restic) and of this process (the S3 server).
type step struct {
	took, cpu, s3cpu time.Duration
	stored           int64 // bytes the step added to the store
	backup           api.Backup
	summary          resticSummary
}

// timed drops the page cache, then times fn, with the quiver server's and
// this process's CPU time. With QUIVER_BENCH_PPROF=DIR it also profiles
// both while fn runs: DIR/NAME-server-N.pprof (the server, in 5 s
// profiles: go tool pprof merges them) and DIR/NAME-s3.pprof (this
// process: the S3 server).
func (b *backupBench) timed(t *testing.T, name string, fn func()) step {
	t.Helper()
	stop := func() {}
	if !b.quick {
		b.dropCaches(t)
		stop = b.profile(t, name)
	}
	srv0, self0 := procCPU(t, b.srv.PID()), selfCPU()
	start := time.Now()
	fn()
	s := step{took: time.Since(start), cpu: procCPU(t, b.srv.PID()) - srv0, s3cpu: selfCPU() - self0}
	stop()
	return s
}

// profile starts the profiles of timed, when asked for, and returns what
// stops them.
func (b *backupBench) profile(t *testing.T, name string) (stop func()) {
	t.Helper()
	dir := os.Getenv("QUIVER_BENCH_PPROF")
	if dir == "" {
		return func() {}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, name+"-s3.pprof"))
	if err != nil {
		t.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=5", b.srv.APIAddr))
			if err != nil {
				t.Errorf("server profile: %v", err)
				return
			}
			data, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Errorf("server profile: %v %s", err, resp.Status)
				return
			}
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-server-%d.pprof", name, i)), data, 0o644); err != nil {
				t.Error(err)
				return
			}
			select {
			case <-done:
				return
			default:
			}
		}
	})
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
		close(done)
		wg.Wait()
	}
}

// quiverBackup backs up vol to target, as the step called name.
func (b *backupBench) quiverBackup(t *testing.T, name, target, vol string, flags ...string) step {
	t.Helper()
	var out []byte
	s := b.timed(t, name, func() {
		out = b.cli(append([]string{"-o", "json", "backup", "create", "--target", target, vol}, flags...)...)
	})
	if err := json.Unmarshal(out, &s.backup); err != nil {
		t.Fatalf("backup create %s: %v\n%s", vol, err, out)
	}
	return s
}

// resticSummary is the last line of restic backup --json.
type resticSummary struct {
	MessageType         string `json:"message_type"`
	DataAdded           int64  `json:"data_added"`
	TotalBytesProcessed int64  `json:"total_bytes_processed"`
}

// resticBackup backs up, with restic, the volume's snapshot snap as image
// files at src (reflinked copies: the same bytes, new inodes, one path for
// every backup so that restic finds its parent).
func (b *backupBench) resticBackup(t *testing.T, src, snap string) step {
	t.Helper()
	if err := os.RemoveAll(src); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	snapDir := filepath.Join(b.mnt, "pool", "volumes", "vm", "snapshots", snap)
	for _, d := range []string{"root", "data", "logs"} {
		if out, err := exec.Command("cp", "--reflink=always", filepath.Join(snapDir, d+".img"), filepath.Join(src, d+".img")).CombinedOutput(); err != nil {
			t.Fatalf("cp --reflink=always: %v\n%s", err, out)
		}
	}
	if !b.inited {
		b.restic(t, "init")
		b.inited = true
	}
	var out []byte
	var rcpu time.Duration
	s := b.timed(t, "restic-backup-"+snap, func() { out, rcpu = b.restic(t, "backup", "--json", "--host", "bench", src) })
	s.cpu = rcpu
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m resticSummary
		if json.Unmarshal(sc.Bytes(), &m) == nil && m.MessageType == "summary" {
			s.summary = m
		}
	}
	if s.summary.MessageType == "" {
		t.Fatalf("restic backup printed no summary:\n%s", out)
	}
	return s
}

// restic runs restic with the benchmark's repository and returns its
// output and CPU time.
func (b *backupBench) restic(t *testing.T, args ...string) ([]byte, time.Duration) {
	t.Helper()
	cmd := exec.Command("restic", args...)
	cmd.Env = b.env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("restic %s: %v\n%s\n%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return out, cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
}

// dropCaches writes back and drops the page cache (root), so that the next
// step reads its disks cold.
func (b *backupBench) dropCaches(t *testing.T) {
	t.Helper()
	syscall.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0o644); err != nil {
		t.Fatalf("dropping the page cache: %v", err)
	}
}

// trim gives the loop image back what its XFS freed.
func (b *backupBench) trim(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("fstrim", b.mnt).CombinedOutput(); err != nil {
		t.Logf("fstrim %s: %v %s", b.mnt, err, out)
	}
}

// storeBytes sums the sizes of the objects under prefix.
func storeBytes(t *testing.T, store objstore.Store, prefix string) (total int64, objects int) {
	t.Helper()
	err := store.List(t.Context(), prefix, func(_ string, n int64) error {
		total += n
		objects++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return total, objects
}

// deletePrefix deletes every object under prefix: the S3 server holds them
// in memory, and the next tool's repository needs it.
func deletePrefix(t *testing.T, store objstore.Store, prefix string) {
	t.Helper()
	var keys []string
	if err := store.List(t.Context(), prefix, func(k string, _ int64) error { keys = append(keys, k); return nil }); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if err := store.Delete(t.Context(), k); err != nil {
			t.Fatal(err)
		}
	}
	debug.FreeOSMemory()
}

// procCPU is the user and system time of process pid so far.
func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command (which may hold spaces), from field 3 on.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func resticVersion(t *testing.T) string {
	out, err := exec.Command("restic", "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Fields(string(out)); len(f) > 1 {
		return f[1]
	}
	return strings.TrimSpace(string(out))
}

// envMiB reads a size in MiB (or a count) from the environment.
func envMiB(t *testing.T, name string, def int64) int64 { return envInt(t, name, def) << 20 }

// envInt is the positive integer in environment variable name, def when
// it is not set.
func envInt(t *testing.T, name string, def int64) int64 {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: a positive integer", name, s)
	}
	return n
}

func secs(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

func rate(n int64, d time.Duration) string {
	return fmt.Sprintf("%.0f MiB/s", float64(n)/float64(mib)/d.Seconds())
}

func cpu(tool, s3 time.Duration) string {
	return fmt.Sprintf("%.1f / %.1f", tool.Seconds(), s3.Seconds())
}

func bytesPair(read, stored int64) string { return size(read) + " / " + size(stored) }

func size(n int64) string {
	switch {
	case n >= gib:
		return fmt.Sprintf("%.2f GiB", float64(n)/float64(gib))
	case n >= mib:
		return fmt.Sprintf("%.1f MiB", float64(n)/float64(mib))
	}
	return fmt.Sprintf("%.1f KiB", float64(n)/1024)
}
