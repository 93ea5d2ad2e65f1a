package pool

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quiverstorage/quiver/internal/durable"
	"github.com/quiverstorage/quiver/internal/fscap"
)

// Capture methods recorded in snapshot manifests.
const (
	MethodReflink = "reflink"
	MethodCopy    = "copy"
)

// CreateSnapshot captures every disk of the volume at one instant. It is
// idempotent by name: an existing snapshot of that name is returned with
// created false. When it returns nil the snapshot is durable; a crash before
// that leaves no trace of it.
func (v *Volume) CreateSnapshot(ctx context.Context, name string, prog Progress) (SnapshotInfo, bool, error) {
	if err := ValidateName("name", name); err != nil {
		return SnapshotInfo{}, false, err
	}
	if s, err := v.Snapshot(name); err == nil {
		return s, false, nil
	}
	unlock, err := v.lockOps("snapshot")
	if err != nil {
		return SnapshotInfo{}, false, err
	}
	defer unlock()
	if s, err := v.Snapshot(name); err == nil {
		return s, false, nil
	}
	staged, err := v.pool.newStaging("snap")
	if err != nil {
		return SnapshotInfo{}, false, mapFSError(err)
	}
	m := v.manifest()
	method, held, err := v.capture(ctx, staged, m, orNop(prog))
	if err != nil {
		v.pool.discard(staged)
		return SnapshotInfo{}, false, fmt.Errorf("snapshot %s@%s: %w", v.name, name, err)
	}
	sm := &snapshotManifest{Kind: "Snapshot", Version: manifestVersion, Name: name, UID: newUID(), Volume: m.Name,
		VolumeUID: m.UID, Capacity: m.Capacity, Disks: m.Disks, Method: method, GateHeld: held, CreatedAt: time.Now().UTC()}
	if err := durable.WriteJSON(filepath.Join(staged, "snapshot.json"), sm); err != nil {
		v.pool.discard(staged)
		return SnapshotInfo{}, false, mapFSError(err)
	}
	if err := durable.Rename(staged, v.snapshotDir(name)); err != nil {
		v.pool.discard(staged)
		return SnapshotInfo{}, false, fmt.Errorf("snapshot %s@%s: %w", v.name, name, err)
	}
	v.mu.Lock()
	v.snaps[name] = sm
	v.mu.Unlock()
	orNop(prog).Done(name)
	return v.snapshotInfo(sm), true, nil
}

// capture copies every disk of m into dstDir as <disk>.img, crash-consistent
// across disks: it closes the I/O gate (waiting for in-flight requests and
// holding new ones), clones each image, and opens the gate again. Reflink
// keeps the gate closed for milliseconds; a copy keeps it closed for the
// whole copy. The copies are fsynced after the gate opens. The caller holds
// the volume's ops lock (shared or exclusive) so the disk set cannot change.
// It returns the method used and how long the gate was held.
func (v *Volume) capture(ctx context.Context, dstDir string, m volumeManifest, prog Progress) (string, time.Duration, error) {
	srcs := make([]*os.File, 0, len(m.Disks))
	dsts := make([]*os.File, 0, len(m.Disks))
	defer func() {
		for _, f := range append(srcs, dsts...) {
			_ = f.Close()
		}
	}()
	for _, d := range m.Disks {
		src, err := os.Open(v.diskPath(d.Name))
		if err != nil {
			return "", 0, err
		}
		srcs = append(srcs, src)
		// Write back dirty pages before closing the gate, so little is left
		// to write back while new I/O waits.
		_ = unix.Fdatasync(int(src.Fd()))
		dst, err := v.pool.newImageFile(filepath.Join(dstDir, d.Name+".img"))
		if err != nil {
			return "", 0, err
		}
		dsts = append(dsts, dst)
	}
	useReflink := v.pool.caps.Reflink
	if !useReflink {
		for _, src := range srcs {
			n, err := fscap.DataBytes(src)
			if err != nil {
				return "", 0, err
			}
			prog.AddTotal(n)
		}
	}

	v.gate.Lock()
	start := time.Now()
	method, err := cloneFiles(ctx, dsts, srcs, useReflink, prog)
	held := time.Since(start)
	v.gate.Unlock()
	if err != nil {
		return "", held, err
	}
	for _, dst := range dsts {
		if err := dst.Sync(); err != nil {
			return "", held, mapFSError(err)
		}
	}
	return method, held, durable.SyncDir(dstDir)
}

// cloneFiles makes each dst a copy of the matching src by reflink, falling
// back to a sparse copy. It does not sync.
func cloneFiles(ctx context.Context, dsts, srcs []*os.File, reflink bool, prog Progress) (string, error) {
	method := MethodReflink
	for i, src := range srcs {
		if reflink {
			err := fscap.Reflink(dsts[i], src)
			if err == nil {
				continue
			}
			if !errors.Is(err, fscap.ErrNotSupported) {
				return "", mapFSError(err)
			}
		}
		method = MethodCopy
		if err := fscap.CopySparse(ctx, dsts[i], src, prog.Add); err != nil {
			return "", mapFSError(err)
		}
	}
	return method, nil
}

// DeleteSnapshot removes a snapshot: one rename into staging, durable on
// return.
func (v *Volume) DeleteSnapshot(ctx context.Context, name string) error {
	if err := ValidateName("snapshot", name); err != nil {
		return err
	}
	unlock, err := v.lockOps("delete snapshot")
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := v.Snapshot(name); err != nil {
		return err
	}
	trash := filepath.Join(v.pool.stagingDir(), "del-"+newUID())
	if err := durable.Rename(v.snapshotDir(name), trash); err != nil {
		return fmt.Errorf("delete snapshot %s@%s: %w", v.name, name, err)
	}
	v.mu.Lock()
	delete(v.snaps, name)
	v.mu.Unlock()
	v.pool.discard(trash)
	return nil
}
