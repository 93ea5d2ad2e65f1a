package blockdev

import (
	"context"
	"errors"
)

// ErrNoTool: a tool Block mode needs (nbdfuse, losetup) is missing.
var ErrNoTool = errors.New("block mode needs nbdfuse (libnbd-bin), losetup (util-linux) and /dev/fuse on the node")

// ErrBadRequest: a device agent refused a request that is not well formed
// or reaches outside what it manages.
var ErrBadRequest = errors.New("bad device request")

// Devices turns an NBD export into a block device on this node and back.
// NbdfuseLoop does it in the calling process; Client asks a device agent
// (Agent), a process of its own that outlives the CSI node plugin.
type Devices interface {
	// Attach exposes the export at uri as a block device: a FUSE file at
	// fuseDir/<file> and a loop device over it. It returns the loop device
	// and the pid of the process serving the file.
	Attach(ctx context.Context, fuseDir, file, uri string, readOnly bool) (loop string, pid int, err error)
	// Detach undoes Attach, whatever part of it was done: the loop device
	// (only if it still points at the FUSE file), the FUSE mount, the
	// process. Detaching what is already gone succeeds.
	Detach(ctx context.Context, fuseDir, file, loop string, pid int) error
	// Healthy reports whether an attachment is still whole. An error says
	// it could not be checked (a device agent that does not answer), which
	// is not the same as broken: nothing should be undone on it.
	Healthy(ctx context.Context, fuseDir, file, loop string, pid int) (bool, error)
}
