package pool

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/quiverstorage/quiver/internal/storage"
)

// capsFile records what the last probe of the pool's filesystem found. A
// probe needs a few new files and some free space; on a pool that filled
// up, the pool opens with the recorded capabilities instead of refusing to
// open at all (which would take every VM's storage down until someone made
// room by hand).
const capsFile = "caps.json"

// capsRecord is caps.json.
type capsRecord struct {
	Kind     string       `json:"kind"` // "PoolCapabilities"
	Version  int          `json:"version"`
	ProbedAt time.Time    `json:"probedAt"`
	Caps     storage.Caps `json:"caps"`
}

// probeCaps finds the capabilities of the pool's filesystem (a probe in
// staging/) and records them in caps.json when they differ from the record.
// When the filesystem is too full to probe, it returns the record's, if
// the record is of the same kind of filesystem.
func (p *Pool) probeCaps() (storage.Caps, error) {
	caps, err := p.fs.Probe("staging")
	var rec capsRecord
	rerr := p.readManifest(capsFile, &rec)
	if rerr == nil && (rec.Kind != "PoolCapabilities" || rec.Version != 1) {
		rerr = fmt.Errorf("kind %q version %d: want PoolCapabilities, version 1", rec.Kind, rec.Version)
	}
	if err == nil {
		if rerr != nil || rec.Caps != caps {
			rec = capsRecord{Kind: "PoolCapabilities", Version: 1, ProbedAt: time.Now().UTC(), Caps: caps}
			if werr := p.writeJSON(filepath.Join(p.dir, capsFile), rec); werr != nil {
				// Only a later open of a full pool needs it.
				p.log.Warn("could not record the pool's capabilities", "file", capsFile, "err", werr)
			}
		}
		return caps, nil
	}
	if !errors.Is(err, ErrNoSpace) {
		return storage.Caps{}, fmt.Errorf("probe pool filesystem: %w", err)
	}
	switch {
	case rerr != nil:
		return storage.Caps{}, fmt.Errorf("probe pool filesystem: %w; %s of an earlier probe cannot stand in: %v (free some space on the pool's filesystem)", err, capsFile, rerr)
	case rec.Caps.Filesystem != caps.Filesystem:
		return storage.Caps{}, fmt.Errorf("probe pool filesystem: %w; %s was probed on %s, the pool is on %s now (free some space on the pool's filesystem)", err, capsFile, rec.Caps.Filesystem, caps.Filesystem)
	}
	p.log.Warn("the pool's filesystem is full: opening with the capabilities probed earlier; free some space",
		"probedAt", rec.ProbedAt, "fs", rec.Caps.Filesystem, "reflink", rec.Caps.Reflink, "err", err)
	return rec.Caps, nil
}
