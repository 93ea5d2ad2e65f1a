package backup

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/quiverstorage/quiver/internal/objstore"
	"github.com/quiverstorage/quiver/internal/pool"
)

// TargetConfig is one backup target in the server's backup configuration
// file (--backup-config): where its repository is and the files that hold
// its secrets (read at start, never logged or returned).
type TargetConfig struct {
	Name          string `json:"name"`
	Endpoint      string `json:"endpoint"` // host:port of the S3 service
	Bucket        string `json:"bucket"`
	Prefix        string `json:"prefix,omitempty"`
	Region        string `json:"region,omitempty"`
	Insecure      bool   `json:"insecure,omitempty"` // plain HTTP: loopback endpoints only
	CAFile        string `json:"caFile,omitempty"`
	AccessKeyFile string `json:"accessKeyFile"`
	SecretKeyFile string `json:"secretKeyFile"`
	// KeyFile holds the repository key (at least 32 random bytes): the
	// store never sees it; without it no backup can be read.
	KeyFile string `json:"keyFile"`
}

// Config is the backup configuration file.
type Config struct {
	Targets []TargetConfig `json:"targets"`
}

// LoadConfig reads and checks a backup configuration file.
func LoadConfig(path string) (Config, error) {
	var c Config
	data, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("backup config %s: %w", path, err)
	}
	seen := map[string]bool{}
	for i, t := range c.Targets {
		if errs := validation.IsDNS1123Label(t.Name); len(errs) > 0 || len(t.Name) > 30 {
			return c, fmt.Errorf("backup config %s: targets[%d].name %q: must be a DNS label of at most 30 characters", path, i, t.Name)
		}
		if seen[t.Name] {
			return c, fmt.Errorf("backup config %s: target %q twice", path, t.Name)
		}
		seen[t.Name] = true
		if t.Endpoint == "" || t.Bucket == "" || t.AccessKeyFile == "" || t.SecretKeyFile == "" || t.KeyFile == "" {
			return c, fmt.Errorf("backup config %s: target %q needs endpoint, bucket, accessKeyFile, secretKeyFile and keyFile", path, t.Name)
		}
	}
	return c, nil
}

// Service runs backups of a pool's volumes to the configured targets.
type Service struct {
	pool    *pool.Pool
	log     *slog.Logger
	mu      sync.Mutex
	targets map[string]*target
	order   []string
	// busy serializes backups of one volume.
	busy sync.Map
	// book keeps each volume's backup status (schedule.go).
	book statusBook
	// cacheDir keeps the repositories' pack indexes (RepoOptions).
	cacheDir string

	// snaps (under mu) takes and deletes backup snapshots; nil: the
	// pool's own (SetSnapshots).
	snaps Snapshots

	// The copies of instant restores (instant.go): ctx ends them at Close;
	// filling holds the volumes being copied.
	ctx     context.Context
	cancel  context.CancelFunc
	fills   sync.WaitGroup
	filling sync.Map
}

// CacheDirName is the directory, in the pool's, where the backup service
// caches the pack indexes of its repositories (one directory per
// repository id; safe to delete).
const CacheDirName = "backup-cache"

type target struct {
	cfg   TargetConfig
	opts  RepoOptions
	store objstore.S3Config
	key   []byte
	mu    sync.Mutex
	repo  *Repository
}

// ErrNoTarget: no backup target of that name is configured.
var ErrNoTarget = errors.New("no such backup target")

// NewService reads every target's secret files; the stores are reached on
// first use, so a store down at start delays nothing.
func NewService(p *pool.Pool, cfg Config, log *slog.Logger) (*Service, error) {
	s := &Service{pool: p, log: log, targets: map[string]*target{}, cacheDir: filepath.Join(p.Dir(), CacheDirName)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	for _, tc := range cfg.Targets {
		read := func(what, path string) ([]byte, error) {
			b, err := os.ReadFile(path)
			if err != nil {
				return nil, fmt.Errorf("backup target %s: %s: %w", tc.Name, what, err)
			}
			return bytes.TrimSpace(b), nil
		}
		access, err := read("access key", tc.AccessKeyFile)
		if err != nil {
			return nil, err
		}
		secret, err := read("secret key", tc.SecretKeyFile)
		if err != nil {
			return nil, err
		}
		key, err := read("repository key", tc.KeyFile)
		if err != nil {
			return nil, err
		}
		if len(key) < MinKeyLen {
			return nil, fmt.Errorf("backup target %s: repository key %s holds %d bytes, at least %d are needed (quiver backup key generate)",
				tc.Name, tc.KeyFile, len(key), MinKeyLen)
		}
		var ca []byte
		if tc.CAFile != "" {
			if ca, err = os.ReadFile(tc.CAFile); err != nil {
				return nil, fmt.Errorf("backup target %s: CA: %w", tc.Name, err)
			}
		}
		s.targets[tc.Name] = &target{cfg: tc, opts: RepoOptions{CacheDir: s.cacheDir}, key: key, store: objstore.S3Config{Endpoint: tc.Endpoint, Bucket: tc.Bucket,
			Prefix: tc.Prefix, Region: tc.Region, AccessKey: string(access), SecretKey: string(secret), Insecure: tc.Insecure, CAPEM: ca}}
		s.order = append(s.order, tc.Name)
	}
	return s, nil
}

// TargetInfo describes a target (no secret).
type TargetInfo struct {
	Name       string
	Store      string
	Repository string // its id once opened
	Error      string // why it cannot be opened now
}

func (s *Service) target(name string) (*target, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.targets[name]
	if t == nil {
		if len(s.order) == 0 {
			return nil, fmt.Errorf("backup target %q: %w: the server has no backup targets (start it with --backup-config)", name, ErrNoTarget)
		}
		return nil, fmt.Errorf("backup target %q: %w (configured: %s)", name, ErrNoTarget, strings.Join(s.order, ", "))
	}
	return t, nil
}

// Default is the only target's name, or "" when there are several or none.
func (s *Service) Default() string {
	if len(s.order) == 1 {
		return s.order[0]
	}
	return ""
}

func (t *target) open(ctx context.Context, create bool) (*Repository, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.repo != nil {
		if create {
			return nil, fmt.Errorf("backup target %s: %w", t.cfg.Name, ErrExists)
		}
		return t.repo, nil
	}
	store, err := objstore.NewS3(ctx, t.store)
	if err != nil {
		return nil, fmt.Errorf("backup target %s: %w", t.cfg.Name, err)
	}
	var r *Repository
	if create {
		r, err = InitWith(ctx, store, t.key, t.opts)
	} else {
		r, err = OpenWith(ctx, store, t.key, t.opts)
	}
	if err != nil {
		return nil, fmt.Errorf("backup target %s: %w", t.cfg.Name, err)
	}
	t.repo = r
	return r, nil
}

// Targets describes the configured targets, opening each.
func (s *Service) Targets(ctx context.Context) []TargetInfo {
	var out []TargetInfo
	for _, name := range s.order {
		t, _ := s.target(name)
		info := TargetInfo{Name: name, Store: fmt.Sprintf("s3://%s/%s/%s", t.cfg.Endpoint, t.cfg.Bucket, t.cfg.Prefix)}
		if r, err := t.open(ctx, false); err != nil {
			info.Error = err.Error()
		} else {
			info.Repository = r.cfg.ID
		}
		out = append(out, info)
	}
	return out
}

// Init makes the target's repository.
func (s *Service) Init(ctx context.Context, name string) (TargetInfo, error) {
	t, err := s.target(name)
	if err != nil {
		return TargetInfo{}, err
	}
	r, err := t.open(ctx, true)
	if err != nil {
		return TargetInfo{}, err
	}
	return TargetInfo{Name: name, Store: r.String(), Repository: r.cfg.ID}, nil
}

// Repo opens a target's repository.
func (s *Service) Repo(ctx context.Context, name string) (*Repository, error) {
	t, err := s.target(name)
	if err != nil {
		return nil, err
	}
	return t.open(ctx, false)
}

// snapshotPrefix names the snapshots a backup takes of a volume for a
// target; the newest is kept as the next backup's base, older ones go.
func snapshotPrefix(target string) string { return "backup-" + target + "-" }

// Backup takes a whole-VM snapshot of volume and stores it in target:
// incremental from the newest backup whose snapshot is still in the pool
// with its checkpoint, full otherwise (or when full is set).
func (s *Service) Backup(ctx context.Context, volume, targetName string, full bool, prog pool.Progress) (*Manifest, error) {
	if _, err := s.target(targetName); err != nil {
		return nil, err
	}
	m, err := s.backup(ctx, volume, targetName, full, prog)
	if err != nil {
		if !errors.Is(err, pool.ErrVolumeNotFound) {
			s.recordFailure(volume, targetName, err)
		}
		return nil, err
	}
	s.recordSuccess(targetName, m)
	return m, nil
}

func (s *Service) backup(ctx context.Context, volume, targetName string, full bool, prog pool.Progress) (*Manifest, error) {
	r, err := s.Repo(ctx, targetName)
	if err != nil {
		return nil, err
	}
	v, err := s.pool.Volume(volume)
	if err != nil {
		return nil, err
	}
	if _, loaded := s.busy.LoadOrStore(volume, true); loaded {
		return nil, fmt.Errorf("volume %s: a backup of it is running: %w", volume, pool.ErrBusy)
	}
	defer s.busy.Delete(volume)
	info := v.Info()
	// An encrypted volume's backup holds its ciphertext and its data key
	// under the volume's backup KEK (pool/backupkey.go).
	key, keyUID, err := v.BackupKey(ctx)
	if err != nil {
		return nil, err
	}
	name := snapshotPrefix(targetName) + time.Now().UTC().Format("20060102-150405") + "-" + randomID(2)
	snap, err := s.snapshots().Snapshot(ctx, volume, name)
	if err != nil {
		return nil, err
	}
	keep := false
	defer func() {
		if !keep {
			if err := s.snapshots().DeleteSnapshot(context.WithoutCancel(ctx), volume, name); err != nil {
				s.log.Warn("backup: removing the snapshot of a failed backup", "volume", volume, "snapshot", name, "err", err)
			}
		}
	}()
	var parent *Manifest
	var changes map[string]Change
	if !full {
		parent, changes, err = s.base(ctx, r, v, info.UID, keyUID, name)
		if err != nil {
			return nil, err
		}
	}
	src, err := openSource(v, snap, key != nil)
	if err != nil {
		return nil, err
	}
	defer src.close()
	m, err := r.Backup(ctx, src, Options{Volume: volume, VolumeUID: info.UID, Snapshot: name, SnapshotUID: snap.UID, Checkpoint: snap.Checkpoint,
		Labels: info.Labels, Parent: parent, Changes: changes, Progress: prog, Key: key, KeyUID: keyUID})
	if err != nil {
		return nil, err
	}
	keep = true
	// Older snapshots of this target are no base any more.
	for _, old := range v.Snapshots() {
		if old.Name != name && strings.HasPrefix(old.Name, snapshotPrefix(targetName)) {
			if err := s.snapshots().DeleteSnapshot(ctx, volume, old.Name); err != nil {
				s.log.Warn("backup: removing an older backup snapshot", "volume", volume, "snapshot", old.Name, "err", err)
			}
		}
	}
	return m, nil
}

// base finds the newest backup of the volume whose snapshot is still a
// checkpoint in the pool, and what changed since. The delta is this pool's
// own (a checkpoint another pool took is ErrNoCheckpoint: no base).
func (s *Service) base(ctx context.Context, r *Repository, v *pool.Volume, uid, keyUID, now string) (*Manifest, map[string]Change, error) {
	list, _, err := r.List(ctx, v.Name())
	if err != nil {
		return nil, nil, err
	}
	for i := len(list) - 1; i >= 0; i-- {
		m := list[i]
		snap, err := v.Snapshot(m.Snapshot)
		if err != nil || snap.Checkpoint == 0 || m.KeyUID != keyUID { // blocks under another data key are no base
			continue
		}
		// The same point: the snapshot's UID (every copy of a cluster's
		// volume has it, each with its own checkpoint), or, in a backup
		// from before it was recorded, this volume's checkpoint.
		if m.SnapshotUID != "" && snap.UID != m.SnapshotUID ||
			m.SnapshotUID == "" && (m.VolumeUID != uid || snap.Checkpoint != m.Checkpoint) {
			continue
		}
		ds, err := v.Changes(ctx, m.Snapshot, now)
		if errors.Is(err, pool.ErrNoCheckpoint) {
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		changes := map[string]Change{}
		for _, d := range ds {
			ch := Change{Whole: d.Whole || d.BaseSize == 0}
			for _, rg := range d.Ranges {
				ch.Ranges = append(ch.Ranges, Range{rg.Offset, rg.Length})
			}
			changes[d.Disk] = ch
		}
		return m, changes, nil
	}
	return nil, nil, nil
}

// source reads a snapshot's disks.
type source struct {
	disks []Disk
	h     map[string]pool.Disk
}

func openSource(v *pool.Volume, snap pool.SnapshotInfo, raw bool) (*source, error) {
	src := &source{h: map[string]pool.Disk{}}
	open := v.OpenSnapshotDisk
	if raw { // an encrypted volume's ciphertext
		open = v.OpenSnapshotDiskRaw
	}
	for _, d := range snap.Disks {
		h, err := open(snap.Name, d.Name)
		if err != nil {
			src.close()
			return nil, err
		}
		src.h[d.Name] = h
		src.disks = append(src.disks, Disk{d.Name, d.Size})
	}
	return src, nil
}

func (s *source) Disks() []Disk { return s.disks }

func (s *source) ReadAt(disk string, p []byte, off int64) error { return s.h[disk].ReadAt(p, off) }

func (s *source) close() {
	for _, h := range s.h {
		_ = h.Close()
	}
}

// Snapshots takes and deletes the whole-VM snapshots a backup reads. On a
// single node they are the pool's own; on a cluster node a replicated
// volume's are taken by its primary on every copy at one cut.
type Snapshots interface {
	Snapshot(ctx context.Context, volume, name string) (pool.SnapshotInfo, error)
	DeleteSnapshot(ctx context.Context, volume, name string) error
}

// SetSnapshots makes the service take its snapshots through snaps. Call it
// before any backup.
func (s *Service) SetSnapshots(snaps Snapshots) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.snaps = snaps
}

func (s *Service) snapshots() Snapshots {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.snaps != nil {
		return s.snaps
	}
	return PoolSnapshots(s.pool)
}

// PoolSnapshots are the pool's own snapshots (a single node's).
func PoolSnapshots(p *pool.Pool) Snapshots { return poolSnapshots{p} }

type poolSnapshots struct{ p *pool.Pool }

func (ps poolSnapshots) Snapshot(ctx context.Context, volume, name string) (pool.SnapshotInfo, error) {
	v, err := ps.p.Volume(volume)
	if err != nil {
		return pool.SnapshotInfo{}, err
	}
	info, _, err := v.CreateSnapshot(ctx, name, nil)
	return info, err
}

func (ps poolSnapshots) DeleteSnapshot(ctx context.Context, volume, name string) error {
	v, err := ps.p.Volume(volume)
	if err != nil {
		return err
	}
	return v.DeleteSnapshot(ctx, name)
}

// Restore makes a new volume from a backup (only the disks named, when
// any) and returns it. On an error the new volume is deleted.
func (s *Service) Restore(ctx context.Context, targetName, id, volume string, disks []string, prog pool.Progress) (pool.VolumeInfo, error) {
	r, m, spec, err := s.restorePlan(ctx, targetName, id, volume, disks)
	if err != nil {
		return pool.VolumeInfo{}, err
	}
	if _, _, err := s.pool.Create(ctx, spec); err != nil {
		return pool.VolumeInfo{}, err
	}
	v, err := s.pool.Volume(volume)
	if err == nil {
		err = restoreInto(ctx, r, m, v, disks, prog)
	}
	if err != nil {
		if derr := s.pool.Delete(context.WithoutCancel(ctx), volume); derr != nil {
			s.log.Error("restore failed and its volume could not be deleted", "volume", volume, "err", derr)
		}
		return pool.VolumeInfo{}, err
	}
	return v.Info(), nil
}

// restorePlan finds backup id in target targetName and the volume its
// restore makes.
func (s *Service) restorePlan(ctx context.Context, targetName, id, volume string, disks []string) (*Repository, *Manifest, pool.VolumeSpec, error) {
	r, err := s.Repo(ctx, targetName)
	if err != nil {
		return nil, nil, pool.VolumeSpec{}, err
	}
	m, err := r.Get(ctx, id)
	if err != nil {
		return nil, nil, pool.VolumeSpec{}, err
	}
	spec, err := restoreSpec(m, volume, disks)
	return r, m, spec, err
}

// restoreSpec is the volume a restore of m makes (only the disks named,
// when any).
func restoreSpec(m *Manifest, volume string, disks []string) (pool.VolumeSpec, error) {
	spec := pool.VolumeSpec{Name: volume, Labels: m.Labels}
	if m.Key != nil { // ciphertext: the volume shares the backup's data key, under a KEK of its own
		k := *m.Key
		spec.Encrypt, spec.KeyFrom, spec.KeyUID = true, &k, m.KeyUID
	}
	for _, d := range m.Disks {
		if len(disks) == 0 || slices.Contains(disks, d.Name) {
			spec.Disks = append(spec.Disks, pool.DiskSpec{Name: d.Name, Size: d.Size})
			spec.Capacity += d.Size
		}
	}
	if len(disks) > 0 && len(spec.Disks) != len(disks) {
		return spec, fmt.Errorf("backup %s has disks %s; asked for %s: %w", m.ID, diskNames(m), strings.Join(disks, ","), pool.ErrInvalid)
	}
	return spec, nil
}

func diskNames(m *Manifest) string {
	var n []string
	for _, d := range m.Disks {
		n = append(n, d.Name)
	}
	return strings.Join(n, ",")
}

type volumeSink struct{ h map[string]pool.Disk }

func (s volumeSink) WriteAt(disk string, p []byte, off int64) error {
	return s.h[disk].WriteAt(p, off, false)
}

func restoreInto(ctx context.Context, r *Repository, m *Manifest, v *pool.Volume, disks []string, prog pool.Progress) error {
	sink := volumeSink{h: map[string]pool.Disk{}}
	defer func() {
		for _, h := range sink.h {
			_ = h.Close()
		}
	}()
	for _, d := range m.Disks {
		if len(disks) > 0 && !slices.Contains(disks, d.Name) {
			continue
		}
		open := v.OpenDisk
		if m.Key != nil { // the blocks are ciphertext under the volume's data key
			open = v.OpenDiskRaw
		}
		h, err := open(d.Name)
		if err != nil {
			return err
		}
		sink.h[d.Name] = h
		// The new disk reads as zeros already; zeroing it whole (a hole
		// punched) marks it changed in the change tracking in one sync,
		// where the restore's writes would each wait for one at the
		// first write to every MiB.
		if err := h.Zero(0, d.Size, pool.ZeroMayTrim|pool.ZeroFast); err != nil && !errors.Is(err, pool.ErrNotSupported) {
			return fmt.Errorf("restore: disk %s: %w", d.Name, err)
		}
	}
	// Writes are made durable as the restore goes, not all at its end, so
	// that the disks write while the blocks are fetched and decoded.
	stop := make(chan struct{})
	flushed := make(chan error, 1)
	go func() { flushed <- flushEvery(sink.h, restoreFlushEvery, stop) }()
	// Fetches wait on the store more than on the CPU: keep more in flight.
	err := r.Restore(ctx, m, disks, sink, prog, 8)
	close(stop)
	if ferr := <-flushed; err == nil {
		err = ferr
	}
	if err != nil {
		return err
	}
	for name, h := range sink.h {
		if err := h.Flush(); err != nil {
			return fmt.Errorf("restore: flush disk %s: %w", name, err)
		}
	}
	return nil
}

// restoreFlushEvery is how often a restore flushes the disks it writes.
const restoreFlushEvery = 500 * time.Millisecond

// flushEvery flushes every disk of h each period until stop is closed, and
// returns the first error (a failed flush is final: the restore fails).
func flushEvery(h map[string]pool.Disk, period time.Duration, stop <-chan struct{}) error {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return nil
		case <-t.C:
		}
		for name, d := range h {
			if err := d.Flush(); err != nil {
				return fmt.Errorf("restore: flush disk %s: %w", name, err)
			}
		}
	}
}
