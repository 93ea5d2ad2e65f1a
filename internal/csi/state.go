package csi

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"github.com/quiverstorage/quiver/internal/durable"
)

// stageRecord is what a node remembers of one staged volume: enough to
// publish it again, to answer NodeGetVolumeStats, and to undo every step of
// staging after a plugin restart. It never holds the attachment token.
type stageRecord struct {
	Volume  string `json:"volume"`
	Kind    string `json:"kind"` // "filesystem" or "block"
	Staging string `json:"stagingPath"`
	// ReadOnly: staged for reading only (a reader-only access mode).
	ReadOnly bool `json:"readOnly,omitempty"`
	// Filesystem mode: the volume directory bound at Staging (the
	// endpoint's socket directory when Endpoint is set).
	Source string `json:"source,omitempty"`
	// Endpoint: the volume is published at the node's endpoint
	// (Config.QuiverEndpoint), to be unpublished when unstaged.
	Endpoint bool `json:"endpoint,omitempty"`
	// Direct: the volume's image files are handed out here (a single
	// node's Filesystem mode, read-write): recorded on the volume before
	// the bind (change tracking then counts its disks changed whole) and
	// cleared once unstaged.
	Direct bool `json:"direct,omitempty"`
	// Block mode: the disk exported, the attachment whose token opened
	// it, the nbdfuse mount point and process, and the loop device.
	Disk       string `json:"disk,omitempty"`
	Attachment string `json:"attachment,omitempty"`
	FuseDir    string `json:"fuseDir,omitempty"`
	PID        int    `json:"pid,omitempty"`
	Loop       string `json:"loop,omitempty"`
	// Targets are the paths the volume is published at.
	Targets []publication `json:"targets,omitempty"`
}

// publication is one NodePublishVolume target.
type publication struct {
	Path       string `json:"path"`
	ReadOnly   bool   `json:"readOnly,omitempty"`
	AccessMode string `json:"accessMode"`
}

func (r *stageRecord) target(path string) (publication, bool) {
	i := slices.IndexFunc(r.Targets, func(p publication) bool { return p.Path == path })
	if i < 0 {
		return publication{}, false
	}
	return r.Targets[i], true
}

func (r *stageRecord) removeTarget(path string) {
	r.Targets = slices.DeleteFunc(r.Targets, func(p publication) bool { return p.Path == path })
}

// stateStore keeps one stageRecord per volume as <dir>/volumes/<volume>.json.
// Every save is atomic and durable when it returns (durable.WriteJSON: temp
// file, fsync, rename, fsync of the directory), so after a crash a record is
// either the one before or the one after a step. Callers hold the volume's
// lock.
type stateStore struct {
	dir string
}

func newStateStore(dir string) (*stateStore, error) {
	s := &stateStore{dir: dir}
	for _, d := range []string{s.volumesDir(), s.fuseRoot()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("state directory: %w", err)
		}
	}
	return s, nil
}

func (s *stateStore) volumesDir() string { return filepath.Join(s.dir, "volumes") }

// fuseRoot holds one nbdfuse mount point per Block-mode volume.
func (s *stateStore) fuseRoot() string { return filepath.Join(s.dir, "fuse") }

func (s *stateStore) path(volume string) string {
	return filepath.Join(s.volumesDir(), volume+".json")
}

// load returns the volume's record, or nil when it has none.
func (s *stateStore) load(volume string) (*stageRecord, error) {
	var r stageRecord
	err := durable.ReadJSON(s.path(volume), &r)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("node state of %s: %w", volume, err)
	}
	return &r, nil
}

func (s *stateStore) save(r *stageRecord) error {
	if err := durable.WriteJSONPath(s.path(r.Volume), r); err != nil {
		return fmt.Errorf("node state of %s: %w", r.Volume, err)
	}
	return nil
}

func (s *stateStore) remove(volume string) error {
	if err := os.Remove(s.path(volume)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("node state of %s: %w", volume, err)
	}
	return durable.SyncDirPath(s.volumesDir())
}
