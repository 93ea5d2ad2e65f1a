package pool

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/quiverstorage/quiver/internal/storage"
)

// capsFile records the capabilities the pool's filesystem has shown
// (capsRecord). A probe needs a few new files and some free space, and any
// try of a feature can fail for a reason that says nothing about the
// feature (an I/O error, no memory): the record stands in for what the
// probe cannot tell, and keeps what the filesystem once showed.
const capsFile = "caps.json"

// capsRecord is caps.json.
type capsRecord struct {
	Kind     string       `json:"kind"` // "PoolCapabilities"
	Version  int          `json:"version"`
	ProbedAt time.Time    `json:"probedAt"`
	Caps     storage.Caps `json:"caps"`
}

// probeCaps finds the capabilities of the pool's filesystem: a probe in
// staging/, merged with caps.json, which it updates. The rules:
//
//   - A capability caps.json records stays, whatever the probe says: a
//     capability the pool has shown is never lowered. On XFS, reflink keeps
//     the unshare guard on (unshare.go), which the pool's files need for as
//     long as they may share extents; a transient failure of the probe's
//     clone must not switch it off. Keeping a capability the filesystem
//     lost costs only speed: clones and snapshots fall back to copies.
//   - A capability the probe cannot tell (storage.ProbeError: the try
//     failed with EIO, ENOSPC, ENOMEM...) and caps.json does not record as
//     present takes caps.json's answer, which came from a probe that could
//     tell. Without a record to stand in, the open fails, saying what to
//     do: an unknown capability is never recorded, nor served, as absent.
//   - A record of another kind of filesystem (caps.json says xfs, the pool
//     is on ext4 now) is of the filesystem the pool was moved from: a copy
//     of the pool's files to another filesystem takes no shared extents
//     along, so a probe that tells everything replaces the record, with a
//     warning. A move to another filesystem of the same kind keeps the
//     record's capabilities; to probe afresh there, remove caps.json while
//     the pool is closed.
//   - caps.json is rewritten when the result differs from it (best effort:
//     only a later open whose probe cannot tell needs it), except when it
//     could not be read (an I/O error): it may hold what the pool has
//     shown, so the probe's answers serve this open and the file stays.
func (p *Pool) probeCaps() (storage.Caps, error) {
	probed, perr := p.fs.Probe("staging")
	var unknown storage.Caps // the flags set: the probe could not tell
	var pe *storage.ProbeError
	switch {
	case perr == nil:
	case errors.As(perr, &pe):
		unknown = pe.Unknown
	default: // the probe told nothing
		for _, f := range unknown.Flags() {
			*f.On = true
		}
	}
	rec, rerr := p.readCaps()
	var why string // why the record cannot stand in
	switch {
	case storage.IsNotExist(rerr):
		why = "there is none"
	case rerr != nil:
		why = rerr.Error()
	case probed.Filesystem == "":
		why = "the probe could not name the pool's filesystem"
	case rec.Caps.Filesystem != probed.Filesystem:
		why = fmt.Sprintf("it was probed on %s, the pool is on %s now", rec.Caps.Filesystem, probed.Filesystem)
	}

	var caps storage.Caps
	if why == "" {
		caps = mergeCaps(rec.Caps, probed, unknown, func(flag, found string) {
			p.log.Warn("the probe of the pool's filesystem did not show a capability "+capsFile+" records: keeping it",
				"capability", flag, "probe", found, "fs", probed.Filesystem, "probedAt", rec.ProbedAt, "err", perr)
		})
		switch {
		case errors.Is(perr, storage.ErrNoSpace):
			p.log.Warn("the pool's filesystem is full: opening with the capabilities "+capsFile+" records; free some space",
				"unknown", flagNames(unknown), "fs", probed.Filesystem, "probedAt", rec.ProbedAt, "reflink", caps.Reflink, "err", perr)
		case perr != nil:
			p.log.Warn("the probe of the pool's filesystem could not tell every capability: "+capsFile+" stands in",
				"unknown", flagNames(unknown), "fs", probed.Filesystem, "probedAt", rec.ProbedAt, "reflink", caps.Reflink, "err", perr)
		}
	} else {
		if names := flagNames(unknown); names != "" {
			hint := "find the cause (the kernel log), fix it and open the pool again"
			if errors.Is(perr, storage.ErrNoSpace) {
				hint = "free some space on the pool's filesystem"
			}
			return storage.Caps{}, fmt.Errorf("probe pool filesystem: %w; %s cannot stand in for %s: %s (%s)",
				perr, capsFile, names, why, hint)
		}
		caps = probed
		if rerr == nil {
			p.log.Warn("the pool's filesystem is not the one "+capsFile+" was probed on: recording the new one's capabilities",
				"was", rec.Caps.Filesystem, "fs", probed.Filesystem, "reflinkWas", rec.Caps.Reflink, "reflink", probed.Reflink)
		}
	}

	switch {
	case errors.Is(rerr, storage.ErrIO):
		p.log.Warn("could not read the pool's recorded capabilities: leaving "+capsFile+" as it is", "err", rerr)
	case rerr != nil || rec.Caps != caps:
		rec = capsRecord{Kind: "PoolCapabilities", Version: 1, ProbedAt: time.Now().UTC(), Caps: caps}
		if werr := p.writeJSON(filepath.Join(p.dir, capsFile), rec); werr != nil {
			p.log.Warn("could not record the pool's capabilities", "file", capsFile, "err", werr)
		}
	}
	return caps, nil
}

// readCaps reads caps.json; a record of another kind or version is an
// error.
func (p *Pool) readCaps() (capsRecord, error) {
	var rec capsRecord
	if err := p.readManifest(capsFile, &rec); err != nil {
		return rec, err
	}
	if rec.Kind != "PoolCapabilities" || rec.Version != 1 {
		return rec, fmt.Errorf("%s: kind %q version %d: want PoolCapabilities, version 1", capsFile, rec.Kind, rec.Version)
	}
	return rec, nil
}

// mergeCaps returns the capabilities of a pool whose record is recorded
// (of the same filesystem) and whose probe found probed, the flags set in
// unknown being those it could not tell: each flag probed or recorded
// present is present; an unknown flag takes the record's answer. kept is
// called for each flag recorded present that the probe did not show, with
// "absent" or "unknown".
func mergeCaps(recorded, probed, unknown storage.Caps, kept func(flag, found string)) storage.Caps {
	caps := probed
	have, rf, uf := caps.Flags(), recorded.Flags(), unknown.Flags()
	for i, f := range have {
		switch {
		case *f.On:
		case *rf[i].On:
			*f.On = true
			found := "absent"
			if *uf[i].On {
				found = "unknown"
			}
			kept(f.Name, found)
		}
	}
	return caps
}

// flagNames lists the names of the flags set in c.
func flagNames(c storage.Caps) string {
	var names []string
	for _, f := range c.Flags() {
		if *f.On {
			names = append(names, f.Name)
		}
	}
	return strings.Join(names, ", ")
}
