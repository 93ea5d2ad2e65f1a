package nbd

import (
	"context"
	"fmt"
	"strings"

	"github.com/quiverstorage/quiver/internal/metrics"
	"github.com/quiverstorage/quiver/internal/pool"
)

// ExportInfo describes one export for NBD_OPT_LIST.
type ExportInfo struct {
	Name        string
	Description string
}

// Export is an opened export.
type Export struct {
	Disk        pool.Disk
	Description string
	// Revoked, when not nil, is closed when the client's access ends (its
	// attachment was detached): the server then closes the connection.
	Revoked <-chan struct{}
}

// Exports resolves export names to disks. It is the server's only view of
// the storage.
type Exports interface {
	// List returns every export, for NBD_OPT_LIST.
	List(ctx context.Context) ([]ExportInfo, error)
	// Open returns a handle on the named export for a client at peer. The
	// caller closes the handle.
	Open(ctx context.Context, name, peer string) (Export, error)
}

// PoolExports serves every disk of every volume of a pool:
//
//	<volume>/<disk>[/<token>]               read-write (read-only with an ro attachment)
//	<volume>@<snapshot>/<disk>[/<token>]    read-only
//
// The token is an attachment's secret (POST /v1/volumes/{volume}/attachments):
// the connection then acts for that attachment and obeys the volume's
// single-writer rule. Without a token, when RequireToken is false, the
// connection gets an implicit attachment of its own (pool.Volume.OpenImplicit).
//
// Every live disk is opened through Metrics (when set), which counts and
// times its requests and applies the volume's QoS limiter; a snapshot's disk
// is counted apart (metrics.Metrics.WrapSnapshot) and not limited.
type PoolExports struct {
	Pool    *pool.Pool
	Metrics *metrics.Metrics
	// RequireToken refuses exports without an attachment token, and LIST:
	// set whenever NBD is served beyond loopback.
	RequireToken bool
}

var _ Exports = PoolExports{}

// ExportName returns the export name of a disk, or of a snapshot's disk
// when snapshot is not empty.
func ExportName(volume, snapshot, disk string) string {
	if snapshot != "" {
		return volume + "@" + snapshot + "/" + disk
	}
	return volume + "/" + disk
}

// ExportRef is a parsed export name.
type ExportRef struct {
	Volume, Snapshot, Disk, Token string
}

// ParseExportName splits an export name. Each part is validated by the pool
// when the export is opened.
func ParseExportName(name string) (ExportRef, error) {
	parts := strings.Split(name, "/")
	if (len(parts) != 2 && len(parts) != 3) || parts[0] == "" || parts[1] == "" || (len(parts) == 3 && parts[2] == "") {
		return ExportRef{}, fmt.Errorf("export %q: want <volume>/<disk>, <volume>@<snapshot>/<disk>, each optionally followed by /<attachment token>", RedactToken(name))
	}
	var r ExportRef
	r.Disk = parts[1]
	if len(parts) == 3 {
		r.Token = parts[2]
	}
	var hasSnap bool
	r.Volume, r.Snapshot, hasSnap = strings.Cut(parts[0], "@")
	if hasSnap && r.Snapshot == "" {
		return ExportRef{}, fmt.Errorf("export %q: empty snapshot name", RedactToken(name))
	}
	return r, nil
}

// List implements Exports.
func (e PoolExports) List(ctx context.Context) ([]ExportInfo, error) {
	if e.RequireToken {
		return nil, fmt.Errorf("listing exports needs no token but reveals every volume, so this server refuses it; ask the API instead: %w", pool.ErrUnauthorized)
	}
	var out []ExportInfo
	for _, v := range e.Pool.List(nil) {
		for _, d := range v.Disks {
			out = append(out, ExportInfo{Name: ExportName(v.Name, "", d.Name),
				Description: fmt.Sprintf("disk %s of volume %s (%d bytes)", d.Name, v.Name, d.Size)})
		}
		vol, err := e.Pool.Volume(v.Name)
		if err != nil {
			continue // deleted meanwhile
		}
		for _, s := range vol.Snapshots() {
			for _, d := range s.Disks {
				out = append(out, ExportInfo{Name: ExportName(v.Name, s.Name, d.Name),
					Description: fmt.Sprintf("disk %s of snapshot %s of volume %s, read-only (%d bytes)", d.Name, s.Name, v.Name, d.Size)})
			}
		}
	}
	return out, nil
}

// errNoAccess answers, when tokens are required, a missing or wrong token
// and an unknown volume alike, so that a client without a token cannot
// tell which volumes exist.
var errNoAccess = fmt.Errorf("no such export, or its attachment token is missing or wrong: %w", pool.ErrUnauthorized)

// Open implements Exports. When tokens are required the token is checked
// before anything about the volume is revealed.
func (e PoolExports) Open(ctx context.Context, name, peer string) (Export, error) {
	ref, err := ParseExportName(name)
	if err != nil {
		return Export{}, fmt.Errorf("%w: %v", pool.ErrInvalid, err)
	}
	if e.RequireToken && ref.Token == "" {
		return Export{}, errNoAccess
	}
	v, err := e.Pool.Volume(ref.Volume)
	if err != nil {
		if e.RequireToken {
			return Export{}, errNoAccess
		}
		return Export{}, err
	}
	var att *pool.Attachment
	if ref.Token != "" {
		if att, err = v.AttachmentByToken(ref.Token); err != nil {
			if e.RequireToken {
				return Export{}, errNoAccess
			}
			return Export{}, err
		}
	}
	if ref.Snapshot != "" {
		d, err := v.OpenSnapshotDisk(ref.Snapshot, ref.Disk)
		if err != nil {
			return Export{}, err
		}
		x := Export{Disk: d, Description: fmt.Sprintf("disk %s of snapshot %s of volume %s, read-only", ref.Disk, ref.Snapshot, ref.Volume)}
		if e.Metrics != nil {
			x.Disk = e.Metrics.WrapSnapshot(d, ref.Volume)
		}
		if att != nil {
			x.Revoked = att.Done()
		}
		return x, nil
	}
	var d pool.Disk
	if att == nil {
		d, att, err = v.OpenImplicit(peer, ref.Disk)
	} else {
		d, err = att.OpenDisk(ref.Disk)
	}
	if err != nil {
		return Export{}, err
	}
	x := Export{Disk: d, Description: fmt.Sprintf("disk %s of volume %s", ref.Disk, ref.Volume), Revoked: att.Done()}
	if e.Metrics != nil {
		x.Disk = e.Metrics.Wrap(d, ref.Volume, ref.Disk, v.QoS())
	}
	return x, nil
}

// RedactToken hides what may be a token in an export name, for logs and
// errors: everything after the second slash, whether or not the name parses.
func RedactToken(name string) string {
	first := strings.IndexByte(name, '/')
	if first < 0 {
		return name
	}
	second := strings.IndexByte(name[first+1:], '/')
	if second < 0 {
		return name
	}
	return name[:first+1+second+1] + "<token>"
}
