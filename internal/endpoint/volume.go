package endpoint

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/quiverstorage/quiver/internal/forward"
	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/pool"
)

// Volume is one publication: a volume whose disks the endpoint serves on
// this node, with the attachment the CSI driver made for the node.
type Volume struct {
	// Name is the volume as the storage nodes' API knows it (the CSI
	// volume ID); it names the socket's directory.
	Name string `json:"name"`
	// Export is the volume's name in its NBD export names (the
	// attachment's URIs: the pool's name, which differs from Name for a
	// tenant's volume); default Name.
	Export string `json:"export,omitempty"`
	// Token is the attachment's NBD token.
	Token string `json:"token"`
	// Disks are the disks served, in the volume's order.
	Disks []Disk `json:"disks"`
}

// Disk is one disk of a published volume.
type Disk struct {
	Name string `json:"name"`
	Size int64  `json:"size"`
}

// check validates a publication before anything is made of it.
func (v *Volume) check() error {
	if err := pool.ValidateName("name", v.Name); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if v.Export == "" {
		v.Export = v.Name
	}
	if err := pool.ValidateName("export", v.Export); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if v.Token == "" {
		return fmt.Errorf("volume %s: the attachment token is required: %w", v.Name, ErrInvalid)
	}
	if len(v.Token) > 512 {
		return fmt.Errorf("volume %s: the attachment token is longer than 512 bytes: %w", v.Name, ErrInvalid)
	}
	if _, err := nbd.ParseExportName(v.Export + "/d/" + v.Token); err != nil {
		return fmt.Errorf("volume %s: the attachment token is not one export name segment: %w", v.Name, ErrInvalid)
	}
	if len(v.Disks) == 0 {
		return fmt.Errorf("volume %s: no disk to serve: %w", v.Name, ErrInvalid)
	}
	if len(v.Disks) > maxDisks {
		return fmt.Errorf("volume %s: %d disks, more than %d: %w", v.Name, len(v.Disks), maxDisks, ErrInvalid)
	}
	seen := map[string]bool{}
	for _, d := range v.Disks {
		if err := pool.ValidateName("disk", d.Name); err != nil {
			return fmt.Errorf("volume %s: %w: %w", v.Name, ErrInvalid, err)
		}
		if seen[d.Name] {
			return fmt.Errorf("volume %s: disk %s named twice: %w", v.Name, d.Name, ErrInvalid)
		}
		seen[d.Name] = true
		if d.Size < 0 {
			return fmt.Errorf("volume %s: disk %s: negative size: %w", v.Name, d.Name, ErrInvalid)
		}
	}
	return nil
}

// maxDisks bounds the disks of one publication (a VM's disks).
const maxDisks = 256

// same reports whether two publications serve the same thing.
func (v Volume) same(o Volume) bool {
	return v.Name == o.Name && v.Export == o.Export && v.Token == o.Token && slices.Equal(v.Disks, o.Disks)
}

// exports serves one published volume's disks, by disk name, each through
// a forward.Disk to the volume's primary of the moment.
type exports struct {
	vol     Volume
	resolve *resolver
	opts    forward.Options
	poll    time.Duration
	log     *slog.Logger
}

var _ nbd.Exports = (*exports)(nil)

func (e *exports) List(context.Context) ([]nbd.ExportInfo, error) {
	out := make([]nbd.ExportInfo, 0, len(e.vol.Disks))
	for _, d := range e.vol.Disks {
		out = append(out, nbd.ExportInfo{Name: d.Name,
			Description: fmt.Sprintf("disk %s of volume %s (%d bytes)", d.Name, e.vol.Name, d.Size)})
	}
	out = append(out, nbd.ExportInfo{Name: DisksExport,
		Description: fmt.Sprintf("every disk of volume %s as one device, disk i at i*%d", e.vol.Name, SlotSize)})
	return out, nil
}

// Open connects to the volume's primary for the disk named: the client
// names only the disk ("" is the volume's first disk), the endpoint adds
// the volume and the token.
func (e *exports) Open(ctx context.Context, name, peer string) (nbd.Export, error) {
	if name == DisksExport {
		return e.openAll(ctx)
	}
	if name == "" {
		name = e.vol.Disks[0].Name
	}
	if !slices.ContainsFunc(e.vol.Disks, func(d Disk) bool { return d.Name == name }) {
		return nbd.Export{}, fmt.Errorf("volume %s has no disk %q published here: %w", e.vol.Name, name, pool.ErrDiskNotFound)
	}
	d, err := e.openDisk(ctx, name)
	if err != nil {
		return nbd.Export{}, err
	}
	return nbd.Export{Disk: d, Description: fmt.Sprintf("disk %s of volume %s", name, e.vol.Name)}, nil
}

// openDisk connects to the volume's primary for one disk.
func (e *exports) openDisk(ctx context.Context, name string) (*forward.Disk, error) {
	opts := e.opts
	opts.Logger = e.log
	opts.Moves = e.moves
	return forward.Open(ctx, e.vol.Export+"/"+name+"/"+e.vol.Token, e.primaryAddr, opts)
}

// openAll opens every disk, as the one device of DisksExport.
func (e *exports) openAll(ctx context.Context) (nbd.Export, error) {
	var disks []pool.Disk
	for _, d := range e.vol.Disks {
		if d.Size > SlotSize {
			closeAll(disks)
			return nbd.Export{}, fmt.Errorf("volume %s: disk %s is larger than %d bytes, a disk's room in the device of every disk: %w",
				e.vol.Name, d.Name, SlotSize, pool.ErrInvalid)
		}
		fd, err := e.openDisk(ctx, d.Name)
		if err != nil {
			closeAll(disks)
			return nbd.Export{}, err
		}
		disks = append(disks, fd)
	}
	return nbd.Export{Disk: newConcatDisk(disks),
		Description: fmt.Sprintf("every disk of volume %s, disk i at i*%d", e.vol.Name, SlotSize)}, nil
}

func closeAll(disks []pool.Disk) {
	for _, d := range disks {
		d.Close()
	}
}

// primaryAddr is the forward.Resolver: the primary's NBD address.
func (e *exports) primaryAddr(ctx context.Context) (string, error) {
	pr, err := e.resolve.primary(ctx)
	if err != nil {
		if final(err) {
			// The storage nodes' word (the volume is gone, the token
			// may not read it): no primary will come, the client's
			// open is refused now rather than after forward's RetryFor.
			return "", fmt.Errorf("volume %s: %w: %w", e.vol.Name, err, pool.ErrInvalid)
		}
		return "", err
	}
	if pr.TLS {
		return "", fmt.Errorf("volume %s: its primary %s requires TLS on NBD, which the endpoint does not speak yet: %w",
			e.vol.Name, pr.Node, pool.ErrInvalid)
	}
	return pr.NBD, nil
}

// moves ticks every poll interval, so that a forward.Disk asks again where
// the primary is and leaves one that is not the primary any more (a
// partition, a drain) without waiting for its request to time out.
func (e *exports) moves(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{}, 1)
	go func() {
		defer close(ch)
		t := time.NewTicker(e.poll)
		defer t.Stop()
		ch <- struct{}{}
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				select {
				case ch <- struct{}{}:
				default:
				}
			}
		}
	}()
	return ch
}
