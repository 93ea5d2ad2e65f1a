package pool

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/durable"
	"github.com/quiverstorage/quiver/internal/qos"
	"github.com/quiverstorage/quiver/internal/storage"
)

// Progress receives the progress of a long operation. Implementations must
// be safe for concurrent use.
type Progress interface {
	AddTotal(bytes int64) // more work became known
	Add(bytes int64)      // this much work is done
	Done(item string)     // one item (a clone, a snapshot) is complete
}

type noProgress struct{}

func (noProgress) AddTotal(int64) {}
func (noProgress) Add(int64)      {}
func (noProgress) Done(string)    {}

func orNop(p Progress) Progress {
	if p == nil {
		return noProgress{}
	}
	return p
}

// ExtentSizeHint is set on every new disk image where the filesystem has
// extent size hints (XFS) and the pool writes no chunks (XFS without
// reflink): random 4 KiB writes then allocate 1 MiB extents instead of
// fragmenting the image. QEMU uses the same default for raw images on XFS.
// With reflink, the chunk rewrite does the same without it (chunks.go,
// newImageFile), and scratch files of the unshare guard still take it.
const ExtentSizeHint = 1 << 20

// Pool is an open pool directory. It is safe for concurrent use.
type Pool struct {
	dir string
	// fs is the pool directory: every file in it is reached through fs,
	// the storage layer (internal/storage), beneath the pool's root.
	fs   storage.FS
	lock storage.File // pool.lock, flocked for the life of the pool (open.go)
	// lockCreated: this open made pool.lock (removed again if it refuses).
	lockCreated bool
	readOnly    bool // served read-only (open.go)
	id          string
	born        time.Time
	caps        storage.Caps
	log         *slog.Logger
	// syncFailures counts failed fdatasync calls on disk images.
	syncFailures atomic.Int64

	mu       sync.Mutex
	volumes  map[string]*Volume
	creating map[string]bool // names reserved by an in-flight create or clone
	limiters map[string]*qos.Limiter

	// chunk is the chunk size of disk writes (chunks.go), 0 for none.
	chunk int64
	// us guards first writes into unowned chunks on XFS (unshare.go); nil
	// elsewhere.
	us *unsharer

	// keyring holds the key providers of encrypted volumes; newKeys names
	// the one that makes new volumes' keys (Options.Keyring, NewKeys).
	keyring crypt.Keyring
	newKeys string

	// writeHook, when set (tests only), runs before a client's write, trim
	// or zero waits for the gate, with the attachment ID.
	writeHook func(attachment string)

	// attachHook publishes attachment changes (adopt.go); under mu.
	attachHook AttachmentsHook
	// deleted are told each volume deleted (OnDelete); under mu.
	deleted []func(volume string)
}

// SetChunkSize sets the unit of chunk ownership (chunks.go) for disks opened
// from now on; 0 turns it off. Pools on filesystems with reflink start with
// ChunkSize, others with 0. For tests.
func (p *Pool) SetChunkSize(n int64) { p.chunk = n }

// SetWriteHook installs a function that every write, trim and zero through an
// attachment calls before it waits for the volume's gate. It is for tests
// that need a write held "in flight"; set it before any I/O starts.
func (p *Pool) SetWriteHook(h func(attachment string)) { p.writeHook = h }

// Info describes a pool.
type Info struct {
	ID         string
	Dir        string
	Caps       storage.Caps
	TotalBytes int64
	FreeBytes  int64
	Volumes    int
	Broken     int  // volumes quarantined at start-up (VolumeInfo.Broken)
	ReadOnly   bool // the pool is served read-only
	CreatedAt  time.Time
	ChunkSize  int64 // chunk ownership unit (chunks.go), 0 when off
}

func (p *Pool) volumesDir() string        { return filepath.Join(p.dir, "volumes") }
func (p *Pool) stagingDir() string        { return filepath.Join(p.dir, "staging") }
func (p *Pool) volumeDir(n string) string { return filepath.Join(p.volumesDir(), n) }

// newStaging makes a fresh directory under staging/ for work that becomes
// visible later by one rename.
func (p *Pool) newStaging(kind string) (string, error) {
	dir := filepath.Join(p.stagingDir(), kind+"-"+newUID())
	if err := p.fs.Mkdir(p.rel(dir), 0o755); err != nil {
		return "", err
	}
	return dir, nil
}

// discard removes a staging directory (best effort: start-up reclaims it
// otherwise).
func (p *Pool) discard(dir string) {
	if err := p.fs.RemoveAll(p.rel(dir)); err != nil {
		p.log.Warn("remove staging", "dir", dir, "err", err)
	}
}

// Caps returns what the pool's filesystem can do.
func (p *Pool) Caps() storage.Caps { return p.caps }

// Dir returns the pool directory.
func (p *Pool) Dir() string { return p.dir }

// FS is the pool's directory in the storage layer, for the few files the
// server keeps beside the volumes (the job history).
func (p *Pool) FS() storage.FS { return p.fs }

// Info reports the pool's identity, capabilities and usage.
func (p *Pool) Info() (Info, error) {
	total, free, err := p.fs.Usage()
	if err != nil {
		return Info{}, err
	}
	p.mu.Lock()
	n := len(p.volumes)
	p.mu.Unlock()
	return Info{ID: p.id, Dir: p.dir, Caps: p.caps, TotalBytes: total, FreeBytes: free, Volumes: n, CreatedAt: p.born,
		ChunkSize: p.chunk, Broken: p.brokenCount(), ReadOnly: p.readOnly}, nil
}

// Volume returns the open volume called name.
func (p *Pool) Volume(name string) (*Volume, error) {
	if err := ValidateName("volume", name); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	v, ok := p.volumes[name]
	if !ok {
		return nil, fmt.Errorf("volume %q: %w", name, ErrVolumeNotFound)
	}
	return v, nil
}

// List returns the volumes for which match returns true, sorted by name.
func (p *Pool) List(match func(labels map[string]string) bool) []VolumeInfo {
	p.mu.Lock()
	vols := make([]*Volume, 0, len(p.volumes))
	for _, v := range p.volumes {
		vols = append(vols, v)
	}
	p.mu.Unlock()
	out := make([]VolumeInfo, 0, len(vols))
	for _, v := range vols {
		info := v.Info()
		if match == nil || match(info.Labels) {
			out = append(out, info)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// FindSnapshots returns the snapshots called name (every snapshot when name
// is "") of the volumes whose labels match (every volume when match is
// nil), sorted by volume and then by creation. It reads memory only, so a
// caller that names snapshots across volumes (CSI) finds one in a single
// call however many volumes the pool holds. Quarantined volumes have none.
func (p *Pool) FindSnapshots(match func(labels map[string]string) bool, name string) []SnapshotInfo {
	p.mu.Lock()
	vols := make([]*Volume, 0, len(p.volumes))
	for _, v := range p.volumes {
		vols = append(vols, v)
	}
	p.mu.Unlock()
	sort.Slice(vols, func(i, j int) bool { return vols[i].name < vols[j].name })
	var out []SnapshotInfo
	for _, v := range vols {
		if v.broken != nil || (match != nil && !match(v.manifest().Labels)) {
			continue
		}
		if name == "" {
			out = append(out, v.Snapshots()...)
		} else if s, err := v.Snapshot(name); err == nil {
			out = append(out, s)
		}
	}
	return out
}

// reserve marks name as being created so that concurrent creates of the same
// name are refused instead of racing.
func (p *Pool) reserve(name string) error {
	if err := p.checkWritable("create volume " + name); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.creating[name] {
		return fmt.Errorf("volume %q is being created: %w", name, ErrBusy)
	}
	p.creating[name] = true
	return nil
}

func (p *Pool) unreserve(name string) {
	p.mu.Lock()
	delete(p.creating, name)
	p.mu.Unlock()
}

// publish makes a staged volume directory visible by renaming it into
// volumes/ (the commit point) and registers it.
func (p *Pool) publish(staged string, m volumeManifest) (*Volume, error) {
	dst := p.volumeDir(m.Name)
	v := newVolume(p, m, nil)
	if err := durable.Rename(p.fs, p.rel(staged), p.rel(dst)); err != nil {
		if err = v.metaError(err); errors.Is(err, ErrVolumeFailed) {
			// Published, but maybe not after a crash: registered failed.
			p.mu.Lock()
			p.volumes[m.Name] = v
			p.mu.Unlock()
		}
		return nil, fmt.Errorf("publish volume %q: %w", m.Name, err)
	}
	p.mu.Lock()
	p.volumes[m.Name] = v
	p.mu.Unlock()
	return v, nil
}

// Close closes every open disk file. Handles fail afterwards. Everything
// already acknowledged as durable stays durable; Close itself writes nothing
// but pool.lock's size (the unshare guard's, unshare.go).
func (p *Pool) Close() error {
	p.mu.Lock()
	vols := make([]*Volume, 0, len(p.volumes))
	for _, v := range p.volumes {
		vols = append(vols, v)
	}
	p.mu.Unlock()
	for _, v := range vols {
		v.gate.Lock()
		v.closeFiles(ErrClosed)
		v.gate.Unlock()
		v.closeChanges()
	}
	if p.us != nil {
		p.us.close()
	}
	p.release()
	return nil
}

// brokenCount counts the quarantined volumes.
func (p *Pool) brokenCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, v := range p.volumes {
		if v.broken != nil {
			n++
		}
	}
	return n
}
