package pool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/storage"
)

// MaxClones bounds the names of one clone request.
const MaxClones = 5000

// cloneWorkers is how many clones of a bulk request are made at once: the
// work is mostly waiting for fsync, so a few in parallel use the disk better.
const cloneWorkers = 8

// CloneRequest asks for new volumes from a snapshot, or from the live volume
// through an implicit snapshot (Source.Snapshot empty).
type CloneRequest struct {
	Source Source
	Names  []string
	Labels map[string]string // added to the source volume's labels
	// Idempotency says when an existing clone of the same source is the
	// answer; its Key is stored with every clone made.
	Idempotency Idempotency
}

func validateClone(req CloneRequest) error {
	if err := ValidateName("source.volume", req.Source.Volume); err != nil {
		return err
	}
	if req.Source.Snapshot != "" {
		if err := ValidateName("source.snapshot", req.Source.Snapshot); err != nil {
			return err
		}
	}
	if len(req.Names) == 0 {
		return invalid("names", "", "at least one name is required")
	}
	if len(req.Names) > MaxClones {
		return invalid("names", "", fmt.Sprintf("at most %d clones per request", MaxClones))
	}
	seen := make(map[string]bool, len(req.Names))
	for i, n := range req.Names {
		f := fmt.Sprintf("names[%d]", i)
		if err := ValidateName(f, n); err != nil {
			return err
		}
		if seen[n] {
			return invalid(f, n, "duplicate name")
		}
		if n == req.Source.Volume {
			return invalid(f, n, "a clone cannot replace its source")
		}
		seen[n] = true
	}
	if err := ValidateIdempotencyKey("idempotency key", req.Idempotency.Key); err != nil {
		return err
	}
	return ValidateLabels("labels", req.Labels)
}

// Clone makes one new volume per name, each a whole-VM copy of the source:
// thin (reflinked) where the filesystem allows, and independent of the source
// afterwards. Each clone becomes visible atomically and is durable when it is
// reported done; after a crash, the clones reported done exist and no other
// is visible. A name that is taken fails with ErrExists before any work,
// unless req.Idempotency allows it and it is a clone of the same source:
// then it counts as made.
func (p *Pool) Clone(ctx context.Context, req CloneRequest, prog Progress) ([]VolumeInfo, error) {
	h, err := p.HoldClone(req)
	if err != nil {
		return nil, err
	}
	return h.Clone(ctx, prog)
}

// CloneHold is what a clone request needs, taken ahead of the work (in a
// job), so that a conflict is refused when the clones are asked for: the
// source's control lock shared, and every target name reserved against
// concurrent creates.
type CloneHold struct {
	p       *Pool
	req     CloneRequest
	src     *Volume
	release func()
	once    sync.Once
}

// HoldClone validates req (as CheckClone) and takes what the clones need,
// or refuses at once: ErrBusy when the source or a name is busy with
// another operation.
func (p *Pool) HoldClone(req CloneRequest) (*CloneHold, error) {
	if err := p.CheckClone(req); err != nil {
		return nil, err
	}
	src, err := p.Volume(req.Source.Volume)
	if err != nil {
		return nil, err
	}
	// A clone belongs to its source's tenant, so its name must be one of
	// that tenant's names (tenant.go).
	if err := src.checkAlive(); err != nil {
		return nil, err
	}
	tenant := src.manifest().Tenant
	for i, n := range req.Names {
		if err := ValidateVolumeTenant(n, tenant); err != nil {
			return nil, fmt.Errorf("names[%d]: clone of a volume of tenant %q: %w", i, tenant, err)
		}
	}
	// Refuse early, before any work, when a name is taken by something else.
	for _, n := range req.Names {
		if err := p.checkCloneTarget(n, req.Source, req.Idempotency); err != nil && !errors.Is(err, errCloneExists) {
			return nil, err
		}
	}
	unlock, err := src.rlockOps("clone")
	if err != nil {
		return nil, err
	}
	for i, n := range req.Names {
		if err := p.reserve(n); err != nil {
			for _, r := range req.Names[:i] {
				p.unreserve(r)
			}
			unlock()
			return nil, err
		}
	}
	return &CloneHold{p: p, req: req, src: src, release: func() {
		for _, n := range req.Names {
			p.unreserve(n)
		}
		unlock()
	}}, nil
}

// Release frees what the hold took, unless Clone already did.
func (h *CloneHold) Release() { h.once.Do(h.release) }

// Clone is Pool.Clone of the held request; it releases the hold.
func (h *CloneHold) Clone(ctx context.Context, prog Progress) ([]VolumeInfo, error) {
	defer h.Release()
	p, req, src := h.p, h.req, h.src
	prog = orNop(prog)
	if err := src.checkAlive(); err != nil {
		return nil, err
	}
	m := src.manifest()
	from, disks, capacity := "", m.Disks, m.Capacity
	if req.Source.Snapshot != "" {
		s, err := src.snapshotManifest(req.Source.Snapshot)
		if err != nil {
			return nil, err
		}
		from, disks, capacity = src.snapshotDir(s.Name), s.Disks, s.Capacity
	} else {
		staged, err := p.newStaging("implicit")
		if err != nil {
			return nil, err
		}
		defer p.discard(staged)
		if _, _, err := src.capture(ctx, staged, m, nil, prog); err != nil {
			return nil, fmt.Errorf("clone %s: implicit snapshot: %w", req.Source.Volume, err)
		}
		from = staged
	}
	if err := p.addCopyTotal(prog, from, disks, len(req.Names)); err != nil {
		return nil, err
	}
	labels := maps.Clone(m.Labels)
	if labels == nil && len(req.Labels) > 0 {
		labels = map[string]string{}
	}
	maps.Copy(labels, req.Labels)

	out := make([]VolumeInfo, len(req.Names))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(cloneWorkers)
	for i, name := range req.Names {
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			info, err := p.cloneOne(gctx, name, m.Tenant, req.Source, req.Idempotency, from, disks, capacity, labels, m.Key, m.KeyUID, prog)
			if err != nil {
				return fmt.Errorf("clone %s: %w", name, err)
			}
			out[i] = info
			prog.Done(name)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return out, nil
}

var errCloneExists = errors.New("clone exists")

// checkCloneTarget returns nil when name is free, errCloneExists when it is
// already a clone of src that idem allows as the answer, and ErrExists
// otherwise.
func (p *Pool) checkCloneTarget(name string, src Source, idem Idempotency) error {
	v, err := p.Volume(name)
	if errors.Is(err, ErrVolumeNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	m := v.manifest()
	same := m.Source != nil && *m.Source == src
	if same && idem.allows(m.IdempotencyKey) {
		return errCloneExists
	}
	if !same {
		return fmt.Errorf("volume %q already exists and is not a clone of %s; pick another name, or delete it first: %w", name, src, ErrExists)
	}
	return idem.existsError(fmt.Sprintf("volume %q", name), true)
}

func (s Source) String() string {
	if s.Snapshot == "" {
		return s.Volume
	}
	return s.Volume + "@" + s.Snapshot
}

// cloneOne makes one clone; the caller has reserved its name.
func (p *Pool) cloneOne(ctx context.Context, name, tenant string, src Source, idem Idempotency, from string, disks []DiskSpec,
	capacity int64, labels map[string]string, key *crypt.WrappedKey, keyUID string, prog Progress) (VolumeInfo, error) {
	switch err := p.checkCloneTarget(name, src, idem); {
	case errors.Is(err, errCloneExists):
		v, err := p.Volume(name)
		if err != nil {
			return VolumeInfo{}, err
		}
		return v.Info(), nil
	case err != nil:
		return VolumeInfo{}, err
	}
	staged, err := p.newStaging("vol")
	if err != nil {
		return VolumeInfo{}, err
	}
	s := src
	m := volumeManifest{Kind: "Volume", Version: manifestVersion, Name: name, UID: newUID(), Capacity: capacity,
		Labels: maps.Clone(labels), Disks: disks, Source: &s, CreatedAt: time.Now().UTC(), IdempotencyKey: idem.Key,
		Tenant: tenant}
	if key != nil {
		// The clone shares the source's blocks, so its data key, under a
		// KEK of its own (encrypt.go).
		if m.Key, err = p.cloneVolumeKey(ctx, key); err != nil {
			p.discard(staged)
			return VolumeInfo{}, err
		}
		m.KeyUID = keyUID
	}
	err = p.stageVolume(staged, m, func(disksDir string) error {
		return p.copyImages(ctx, disksDir, from, disks, prog)
	})
	if err != nil {
		p.discard(staged)
		p.dropVolumeKey(m.Key)
		return VolumeInfo{}, err
	}
	v, err := p.publish(staged, m)
	if err != nil {
		p.discard(staged)
		p.dropVolumeKey(m.Key)
		return VolumeInfo{}, err
	}
	return v.Info(), nil
}

// copyImages clones <disk>.img of every disk from fromDir into toDir, reflink
// or copy, and fsyncs each copy. The sources must not change meanwhile.
func (p *Pool) copyImages(ctx context.Context, toDir, fromDir string, disks []DiskSpec, prog Progress) error {
	for _, d := range disks {
		if err := p.copyImage(ctx, filepath.Join(toDir, d.Name+".img"), filepath.Join(fromDir, d.Name+".img"), prog); err != nil {
			return err
		}
	}
	return nil
}

// addCopyTotal tells prog how many bytes copying the images of disks in dir
// times times will move, when the pool copies instead of reflinking.
func (p *Pool) addCopyTotal(prog Progress, dir string, disks []DiskSpec, times int) error {
	if p.caps.Reflink {
		return nil
	}
	for _, d := range disks {
		f, err := p.openImage(p.rel(filepath.Join(dir, d.Name+".img")), os.O_RDONLY)
		if err != nil {
			return err
		}
		n, err := storage.DataBytes(f)
		_ = f.Close()
		if err != nil {
			return err
		}
		prog.AddTotal(n * int64(times))
	}
	return nil
}

func (p *Pool) copyImage(ctx context.Context, dstPath, srcPath string, prog Progress) error {
	src, err := p.openImage(p.rel(srcPath), os.O_RDONLY)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := p.newImageFile(dstPath)
	if err != nil {
		return err
	}
	defer dst.Close()
	if _, err := cloneFiles(ctx, []storage.File{dst}, []storage.File{src}, p.caps.Reflink, prog); err != nil {
		return err
	}
	return dst.Sync()
}

func (v *Volume) snapshotManifest(name string) (*snapshotManifest, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	s, ok := v.snaps[name]
	if !ok {
		return nil, fmt.Errorf("snapshot %q of volume %q: %w", name, v.name, ErrSnapshotNotFound)
	}
	return s, nil
}

// CheckClone validates a clone request and checks that its source exists and
// that no name is taken by something other than a clone of that source.
func (p *Pool) CheckClone(req CloneRequest) error {
	if err := validateClone(req); err != nil {
		return err
	}
	src, err := p.Volume(req.Source.Volume)
	if err != nil {
		return err
	}
	if req.Source.Snapshot != "" {
		if _, err := src.snapshotManifest(req.Source.Snapshot); err != nil {
			return err
		}
	}
	for _, n := range req.Names {
		if err := p.checkCloneTarget(n, req.Source, req.Idempotency); err != nil && !errors.Is(err, errCloneExists) {
			return err
		}
	}
	return nil
}
