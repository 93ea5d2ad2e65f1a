package pool

import "reflect"

// Capabilities are the optional ways a disk handle offers to run requests,
// besides the methods of Disk; each is nil when the handle does not offer
// it, and otherwise is the handle itself. A server uses a handle's
// capabilities only as the handle declares them (CapabilitiesOf), never by
// asserting its type: a wrapper that counts, replicates or fences requests
// must not let a request reach the handle it wraps by another way, so it
// offers its own implementation, which runs its checks, or nothing
// (docs/design/0002-disk-capabilities.md).
type Capabilities struct {
	// Nonblocking tries reads and writes without waiting.
	Nonblocking Nonblocking
	// Batcher tries many reads and writes at once; a server uses it only
	// with Nonblocking.
	Batcher Batcher
	// Sender sends a range from the page cache straight to a socket.
	Sender Sender
	// DataReader reads the data extents of a range as one request.
	DataReader DataReader
	// Starter starts reads and writes served elsewhere without waiting
	// for them (async.go).
	Starter Starter
	// Changes reports what changed in the disk since a checkpoint
	// (changereport.go).
	Changes ChangeReporter
}

// DataReader is implemented by disk handles that account a sparse read as
// one request (metrics.Disk): QoS and metrics must see what the client
// asked, not one request per data extent. ReadData reads the data extents
// among ext (which cover [off, off+len(p))) into p, as ReadExtents does;
// holes are left as they are in p.
type DataReader interface {
	ReadData(p []byte, off int64, ext []Extent) error
}

// Capabilities: a live disk's handle tries requests without waiting, in
// batches, sends reads with sendfile(2) (not from an encrypted disk, whose
// image holds ciphertext) and reports its disk's changes.
func (d *liveDisk) Capabilities() Capabilities {
	if d.df.enc != nil {
		return Capabilities{Nonblocking: d, Batcher: d, Changes: d}
	}
	return Capabilities{Nonblocking: d, Batcher: d, Sender: d, Changes: d}
}

// CapabilitiesOf returns the capabilities d declares, less any that is not
// d itself: a wrapper that embeds the handle it wraps inherits that
// handle's Capabilities method, whose capabilities would let requests skip
// the wrapper; they are dropped, and the wrapper offers none until it
// declares its own. The server calls it once per opened export.
func CapabilitiesOf(d Disk) Capabilities {
	c := d.Capabilities()
	if !isHandle(d, c.Nonblocking) {
		c.Nonblocking = nil
	}
	if !isHandle(d, c.Batcher) {
		c.Batcher = nil
	}
	if !isHandle(d, c.Sender) {
		c.Sender = nil
	}
	if !isHandle(d, c.DataReader) {
		c.DataReader = nil
	}
	if !isHandle(d, c.Starter) {
		c.Starter = nil
	}
	if !isHandle(d, c.Changes) {
		c.Changes = nil
	}
	return c
}

// isHandle reports whether the capability c is the handle d itself. Values
// of a type that cannot be compared never are (comparing them would panic).
func isHandle(d Disk, c any) bool {
	if c == nil {
		return false
	}
	return reflect.TypeOf(c) == reflect.TypeOf(d) && reflect.ValueOf(c).Comparable() && c == any(d)
}
