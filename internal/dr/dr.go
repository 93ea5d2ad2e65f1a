// Package dr is disaster recovery per VM (issue 34): a volume is shipped,
// point after point, to a volume on another site, so that the other site
// can take over with the VM's disks as they were at the last point.
//
// A point is a whole-VM snapshot of the source volume: one crash-consistent
// cut across every disk. A cycle (Source.Cycle) takes a new point and ships
// what changed since the last point the target holds, read from the
// source's change tracking (internal/pool/changes.go), or every allocated
// byte when the target holds none of the source's points. The target
// (Receiver) writes it into its volume and takes a snapshot of the same
// name: its points are those snapshots, and the newest is the last point.
//
// The target is always exactly one source point. Its live disks are
// scratch while a cycle applies; a cycle that did not commit (the link cut,
// the source gone, a crash of either side) leaves the last point's
// snapshot, and the next cycle first rolls the live disks back to it when
// they changed since (the target's own change tracking says). A promote
// (a later step) starts from the last point too.
//
// What is here: the cycle and the receiver, talking through the Target
// interface. Not yet: the transport between sites, relationships and their
// schedules (RPO), promote, demote and failback, the csi-addons service.
//
// Imports from quiver: api, client, crypt, pool.
package dr

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/quiverstorage/quiver/internal/pool"
)

// Point is one crash-consistent point of a source volume: a snapshot of
// the same name on both sides, "dr-<relationship>-<seq>-<tag>", the tag
// random per point so that a point of another source is never taken for
// this one's.
type Point struct {
	Seq      uint64
	Snapshot string
}

// Errors. Callers test them with errors.Is.
var (
	// ErrDiverged: the target's last point is not the base the source
	// ships from (another source's points, or a target changed since).
	ErrDiverged = errors.New("the target does not hold the point this delta starts from")
)

// snapshotPrefix starts the snapshots of points.
const snapshotPrefix = "dr-"

// newPoint names point seq of relationship rel.
func newPoint(rel string, seq uint64) Point {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return Point{Seq: seq, Snapshot: snapshotPrefix + rel + "-" + strconv.FormatUint(seq, 10) + "-" + hex.EncodeToString(b[:])}
}

// parsePoint reads a snapshot name as a point of rel.
func parsePoint(rel, name string) (Point, bool) {
	s, ok := strings.CutPrefix(name, snapshotPrefix+rel+"-")
	if !ok {
		return Point{}, false
	}
	num, tag, ok := strings.Cut(s, "-")
	if !ok || len(tag) != 8 {
		return Point{}, false
	}
	if _, err := hex.DecodeString(tag); err != nil {
		return Point{}, false
	}
	seq, err := strconv.ParseUint(num, 10, 64)
	if err != nil || seq == 0 || strconv.FormatUint(seq, 10) != num {
		return Point{}, false
	}
	return Point{Seq: seq, Snapshot: name}, true
}

// ValidateRelationship checks a relationship's name: a DNS label short
// enough that its points' snapshot names are valid.
func ValidateRelationship(rel string) error {
	if err := pool.ValidateName("relationship", rel); err != nil {
		return err
	}
	if len(rel) > 30 {
		return fmt.Errorf("relationship %q: at most 30 characters: %w", rel, pool.ErrInvalid)
	}
	return nil
}

// points returns the points of rel among snaps, oldest first.
func points(rel string, snaps []pool.SnapshotInfo) []Point {
	var out []Point
	for _, s := range snaps {
		if p, ok := parsePoint(rel, s.Name); ok {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b Point) int { return cmp.Compare(a.Seq, b.Seq) })
	return out
}
