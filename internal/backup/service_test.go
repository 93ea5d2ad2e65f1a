package backup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/crypt/keyfile"
	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/tests3"
)

// testService is a pool with a 3-disk volume and a backup service with
// one target on a fresh S3 server.
func testService(t *testing.T) (*Service, *pool.Pool, *tests3.Server) {
	t.Helper()
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	kf, err := keyfile.Open(filepath.Join(dir, "keys.json")) // for encrypted volumes
	if err != nil {
		t.Fatal(err)
	}
	ring, err := crypt.NewKeyring(kf)
	if err != nil {
		t.Fatal(err)
	}
	p, err := pool.OpenWith(ctx, t.TempDir(), pool.Options{Logger: log, Keyring: ring})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	srv := tests3.Start(t)
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	cfg := Config{Targets: []TargetConfig{{Name: "main", Endpoint: srv.Config.Endpoint, Bucket: srv.Config.Bucket,
		Prefix: "site-a", Insecure: true, AccessKeyFile: write("access", srv.Config.AccessKey+"\n"),
		SecretKeyFile: write("secret", srv.Config.SecretKey), KeyFile: write("key", strings.Repeat("r", 44))}}}
	data, _ := json.Marshal(cfg)
	loaded, err := LoadConfig(write("backup.json", string(data)))
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewService(p, loaded, log)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.Create(ctx, pool.VolumeSpec{Name: "vm", Capacity: 64 << 20, Labels: map[string]string{"app": "db"},
		Disks: []pool.DiskSpec{{Name: "root", Size: 8 << 20}, {Name: "data", Size: 8 << 20}, {Name: "logs", Size: 4 << 20}}}); err != nil {
		t.Fatal(err)
	}
	return s, p, srv
}

func scribble(t *testing.T, v *pool.Volume, rng *rand.Rand, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		disk := []string{"root", "data", "logs"}[rng.IntN(3)]
		h, err := v.OpenDisk(disk)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4096*(1+rng.IntN(4)))
		for j := range buf {
			buf[j] = byte(rng.UintN(256))
		}
		if err := h.WriteAt(buf, rng.Int64N(h.Size()-int64(len(buf))), false); err != nil {
			t.Fatal(err)
		}
		h.Close()
	}
}

func contents(t *testing.T, v *pool.Volume) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, d := range v.Info().Disks {
		h, err := v.OpenDisk(d.Name)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, h.Size())
		if err := h.ReadAt(buf, 0); err != nil {
			t.Fatal(err)
		}
		h.Close()
		out[d.Name] = buf
	}
	return out
}

func TestServiceBackupRestore(t *testing.T) {
	ctx := context.Background()
	s, p, _ := testService(t)
	if _, err := s.Backup(ctx, "vm", "main", false, nil); err == nil || !errors.Is(err, ErrNoRepository) {
		t.Fatalf("backup before init: %v", err)
	}
	if _, err := s.Init(ctx, "main"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Backup(ctx, "vm", "nope", false, nil); !errors.Is(err, ErrNoTarget) {
		t.Fatalf("unknown target: %v", err)
	}
	v, _ := p.Volume("vm")
	rng := rand.New(rand.NewPCG(7, 8))
	scribble(t, v, rng, 200)
	first, err := s.Backup(ctx, "vm", "main", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	at1 := contents(t, v)
	if first.Parent != "" || first.Stats.BytesRead != 20<<20 {
		t.Errorf("first backup: parent %q, read %d", first.Parent, first.Stats.BytesRead)
	}
	scribble(t, v, rng, 5)
	second, err := s.Backup(ctx, "vm", "main", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	at2 := contents(t, v)
	// 5 writes of at most 16 KiB: at most two blocks each.
	if second.Parent != first.ID || second.Stats.BytesRead > 10*BlockSize {
		t.Errorf("second backup: parent %q (want %s), read %d bytes for 5 writes", second.Parent, first.ID, second.Stats.BytesRead)
	}
	// Only the newest backup snapshot stays, as the next base.
	var snaps []string
	for _, sn := range v.Snapshots() {
		snaps = append(snaps, sn.Name)
	}
	if len(snaps) != 1 || snaps[0] != second.Snapshot {
		t.Errorf("snapshots after two backups: %v, want only %s", snaps, second.Snapshot)
	}
	for _, tc := range []struct {
		id, vol string
		want    map[string][]byte
	}{{first.ID, "r1", at1}, {second.ID, "r2", at2}} {
		info, err := s.Restore(ctx, "main", tc.id, tc.vol, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if info.Labels["app"] != "db" || len(info.Disks) != 3 {
			t.Errorf("restored volume %+v", info)
		}
		rv, _ := p.Volume(tc.vol)
		got := contents(t, rv)
		for d, want := range tc.want {
			if !bytes.Equal(got[d], want) {
				t.Fatalf("restore of %s: disk %s differs", tc.id, d)
			}
		}
	}
	// A restore that fails leaves no volume behind.
	if _, err := s.Restore(ctx, "main", first.ID, "r3", []string{"nope"}, nil); !errors.Is(err, pool.ErrInvalid) {
		t.Errorf("restore of a missing disk: %v", err)
	}
	if _, err := p.Volume("r3"); !errors.Is(err, pool.ErrVolumeNotFound) {
		t.Errorf("failed restore left volume r3: %v", err)
	}
	// A full backup on request, and the base gone: full.
	if err := v.DeleteSnapshot(ctx, second.Snapshot); err != nil {
		t.Fatal(err)
	}
	third, err := s.Backup(ctx, "vm", "main", false, nil)
	if err != nil || third.Parent != "" || third.Stats.BytesRead != 20<<20 {
		t.Fatalf("backup without its base snapshot: %+v %v", third, err)
	}
}

func TestServiceStoreDownMidway(t *testing.T) {
	ctx := context.Background()
	s, p, srv := testService(t)
	if _, err := s.Init(ctx, "main"); err != nil {
		t.Fatal(err)
	}
	v, _ := p.Volume("vm")
	scribble(t, v, rand.New(rand.NewPCG(1, 1)), 100)
	// Four requests answered (the listing of backups, the lock's put and
	// listing, the listing of indexes), then the store goes down: at the
	// first pack.
	srv.FailAfter(5)
	if _, err := s.Backup(ctx, "vm", "main", false, nil); err == nil {
		t.Fatal("backup with the store going down: no error")
	}
	if n := len(v.Snapshots()); n != 0 {
		t.Errorf("a failed backup left %d snapshots", n)
	}
	srv.Down(false)
	r, _ := s.Repo(ctx, "main")
	if list, _, err := r.List(ctx, ""); err != nil || len(list) != 0 {
		t.Fatalf("after a failed backup: %v %v", list, err)
	}
	if _, err := s.Backup(ctx, "vm", "main", false, nil); err != nil {
		t.Fatalf("backup once the store is back: %v", err)
	}
}

func TestSchedulePruneAndMetrics(t *testing.T) {
	ctx := context.Background()
	s, p, _ := testService(t)
	if _, err := s.Init(ctx, "main"); err != nil {
		t.Fatal(err)
	}
	v, _ := p.Volume("vm")
	if _, err := v.SetBackupPolicy(ctx, &pool.BackupPolicy{Every: 30 * time.Second}); !errors.Is(err, pool.ErrInvalid) {
		t.Fatalf("a policy under a minute: %v", err)
	}
	if _, err := v.SetBackupPolicy(ctx, &pool.BackupPolicy{Every: time.Hour, KeepLast: 2}); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(9, 9))
	r, _ := s.Repo(ctx, "main")
	count := func() int {
		list, _, err := r.List(ctx, "vm")
		if err != nil {
			t.Fatal(err)
		}
		return len(list)
	}
	for round := 1; round <= 3; round++ {
		scribble(t, v, rng, 50)
		s.RunDue(ctx)
		if n := count(); n != min(round, 2) {
			t.Fatalf("round %d: %d backups, want %d (keep last 2)", round, n, min(round, 2))
		}
		s.RunDue(ctx) // not due again within the hour
		if n := count(); n != min(round, 2) {
			t.Fatalf("round %d: a second pass made a backup that was not due (%d)", round, n)
		}
		// An hour passes.
		st := s.status("vm", "main")
		s.book.mu.Lock()
		st.LastSuccess = st.LastSuccess.Add(-time.Hour)
		s.book.mu.Unlock()
	}
	// The pruned backups' packs are collected: every pack left holds
	// blocks of a backup left, and none is mostly unused.
	if removed, _, err := r.Collect(ctx); err != nil || removed != 0 {
		t.Errorf("chunks left after pruning: %d %v", removed, err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(s)
	metric := func(name string) float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				return mf.GetMetric()[0].GetGauge().GetValue() + mf.GetMetric()[0].GetCounter().GetValue()
			}
		}
		t.Fatalf("no metric %s", name)
		return 0
	}
	if metric("quiver_backup_policy_interval_seconds") != 3600 || metric("quiver_backup_overdue") != 0 ||
		metric("quiver_backup_sent_bytes_total") <= 0 {
		t.Errorf("metrics after scheduled backups: interval %v overdue %v sent %v", metric("quiver_backup_policy_interval_seconds"),
			metric("quiver_backup_overdue"), metric("quiver_backup_sent_bytes_total"))
	}
	st := s.status("vm", "main")
	s.book.mu.Lock()
	st.LastSuccess = time.Now().Add(-2 * time.Hour)
	s.book.mu.Unlock()
	if metric("quiver_backup_overdue") != 1 {
		t.Error("a backup two intervals old is not overdue")
	}
	// A deleted volume's series go.
	if err := p.DeleteWith(ctx, "vm", pool.DeleteOptions{Recursive: true}); err != nil {
		t.Fatal(err)
	}
	mfs, _ := reg.Gather()
	if len(mfs) != 0 {
		t.Errorf("series of a deleted volume: %v", mfs)
	}
}

// TestEncryptedBackupHoldsCiphertext: a backup of an encrypted volume
// holds its ciphertext, as the pool does, and its data key wrapped under the
// volume's backup KEK; incremental backups follow as for any volume; a
// restore makes an encrypted volume that reads what was backed up; the
// backups stay restorable after a shallow rekey (another KEK) and after a
// deep rekey (the next backup is full, under the new data key); a shred of
// the volume makes every backup unrestorable.
func TestEncryptedBackupHoldsCiphertext(t *testing.T) {
	ctx := context.Background()
	s, p, _ := testService(t)
	if _, err := s.Init(ctx, "main"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.Create(ctx, pool.VolumeSpec{Name: "secret", Capacity: 16 << 20, Encrypt: true,
		Disks: []pool.DiskSpec{{Name: "root", Size: 4 << 20}, {Name: "data", Size: 2 << 20}}}); err != nil {
		t.Fatal(err)
	}
	v, _ := p.Volume("secret")
	marker := []byte("plaintext-marker-0123456789")
	model := map[string][]byte{"root": make([]byte, 4<<20), "data": make([]byte, 2<<20)}
	write := func(disk string, off int64, n int, seed byte) {
		t.Helper()
		b := bytes.Repeat(marker, n/len(marker)+1)[:n]
		b[0] = seed
		h, err := v.OpenDisk(disk)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		if err := h.WriteAt(b, off, true); err != nil {
			t.Fatal(err)
		}
		copy(model[disk][off:], b)
	}
	check := func(what, volume string, want map[string][]byte) {
		t.Helper()
		rv, err := p.Volume(volume)
		if err != nil {
			t.Fatal(err)
		}
		for disk, w := range want {
			h, err := rv.OpenDisk(disk)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			got := make([]byte, len(w))
			err = h.ReadAt(got, 0)
			_ = h.Close()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, w) {
				t.Fatalf("%s: disk %s of %s is not what was backed up", what, disk, volume)
			}
		}
	}
	snapshotOf := func() map[string][]byte {
		c := map[string][]byte{}
		for k, b := range model {
			c[k] = bytes.Clone(b)
		}
		return c
	}
	write("root", 0, 300<<10, 1)
	write("root", 3<<20+123, 5000, 2)
	write("data", 1<<20, 64<<10, 3)
	m1, err := s.Backup(ctx, "secret", "main", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	at1 := snapshotOf()
	write("data", 4096, 8192, 4)
	m2, err := s.Backup(ctx, "secret", "main", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	at2 := snapshotOf()
	info := v.Info()
	switch {
	case m1.Key == nil || m2.Key == nil || m1.KeyUID == "" || m2.KeyUID != m1.KeyUID:
		t.Fatalf("backups' keys: %+v %q, %+v %q", m1.Key, m1.KeyUID, m2.Key, m2.KeyUID)
	case m1.Key.KeyID == info.Encryption.KeyID:
		t.Fatal("the backup's data key is under the volume's own KEK, not its backup KEK")
	case m2.Parent != m1.ID:
		t.Fatalf("the second backup's parent is %q, want %s (incremental)", m2.Parent, m1.ID)
	}
	// What the store holds is the pool's ciphertext, never the plaintext.
	r, err := s.Repo(ctx, "main")
	if err != nil {
		t.Fatal(err)
	}
	raw := &captureSink{by: map[string][]byte{}}
	if err := r.Restore(ctx, m2, nil, raw, nil, 4); err != nil {
		t.Fatal(err)
	}
	for disk, b := range raw.by {
		if bytes.Contains(b, marker[:20]) {
			t.Fatalf("backup of disk %s holds the plaintext", disk)
		}
	}
	// An instant restore serves the volume at once: its reads decrypt what
	// the copy fetches, raw, from the store.
	if _, err := s.InstantRestore(ctx, "main", m2.ID, "instant", nil); err != nil {
		t.Fatal(err)
	}
	check("instant restore, while it fills", "instant", at2)
	waitWhole(t, p, "instant")
	check("instant restore, once whole", "instant", at2)
	if iv, _ := p.Volume("instant"); iv.Info().Encryption == nil || iv.Info().Encryption.KeyID == m2.Key.KeyID {
		t.Fatalf("instant restore's encryption %+v: want a KEK of its own", iv.Info().Encryption)
	}
	if _, err := r.OpenDisk(ctx, m2.ID, "root"); !errors.Is(err, pool.ErrEncrypted) {
		t.Fatalf("serving an encrypted backup's disk: %v, want ErrEncrypted", err)
	}
	restored, err := s.Restore(ctx, "main", m1.ID, "r1", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if restored.Encryption == nil || restored.Encryption.KeyID == m1.Key.KeyID {
		t.Fatalf("restored volume's encryption %+v: want a KEK of its own", restored.Encryption)
	}
	check("restore of the full backup", "r1", at1)

	// A shallow rekey: the backups keep their own KEK.
	if _, err := v.Rekey(ctx, pool.RekeyOptions{}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Restore(ctx, "main", m2.ID, "r2", nil, nil); err != nil {
		t.Fatal(err)
	}
	check("restore of the incremental after a shallow rekey", "r2", at2)

	// A deep rekey wants the backup's base snapshot gone; the next backup
	// is then full, under the new data key.
	if _, err := v.Rekey(ctx, pool.RekeyOptions{Deep: true, Rate: 1 << 40}, nil); !errors.Is(err, pool.ErrHasSnapshots) {
		t.Fatalf("deep rekey with the backup's snapshot: %v, want ErrHasSnapshots", err)
	}
	for _, sn := range v.Snapshots() {
		if err := v.DeleteSnapshot(ctx, sn.Name); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := v.Rekey(ctx, pool.RekeyOptions{Deep: true, Rate: 1 << 40}, nil); err != nil {
		t.Fatal(err)
	}
	m3, err := s.Backup(ctx, "secret", "main", false, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m3.Parent != "" || m3.KeyUID == m1.KeyUID {
		t.Fatalf("the backup after a deep rekey: parent %q, key uid %q (before %q): want full, under the new key", m3.Parent, m3.KeyUID, m1.KeyUID)
	}
	if _, err := s.Restore(ctx, "main", m3.ID, "r3", nil, nil); err != nil {
		t.Fatal(err)
	}
	check("restore after a deep rekey", "r3", at2)
	if _, err := s.Restore(ctx, "main", m1.ID, "r1b", nil, nil); err != nil {
		t.Fatal(err)
	}
	check("restore of a backup from before the deep rekey", "r1b", at1)

	// Shredding the volume (and the restores of its backups after the
	// deep rekey, which share its data key) leaves no backup restorable.
	if err := p.DeleteWith(ctx, "secret", pool.DeleteOptions{Shred: true, ShredAlso: []string{"r3"}}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []*Manifest{m1, m2, m3} {
		if _, err := s.Restore(ctx, "main", m.ID, "after-shred", nil, nil); !errors.Is(err, pool.ErrKeyUnavailable) {
			t.Fatalf("restore of backup %s after the shred: %v, want ErrKeyUnavailable", m.ID, err)
		}
	}
}

// captureSink keeps what a restore writes, by disk; the restore writes
// from several goroutines.
type captureSink struct {
	mu sync.Mutex
	by map[string][]byte
}

func (c *captureSink) WriteAt(disk string, p []byte, off int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.by[disk]
	if need := off + int64(len(p)); int64(len(b)) < need {
		b = append(b, make([]byte, need-int64(len(b)))...)
	}
	copy(b[off:], p)
	c.by[disk] = b
	return nil
}
