package pool

import (
	"errors"
	"sync/atomic"

	"github.com/quiverstorage/quiver/internal/storage"
)

// ErrWouldBlock says a Try request was not done because it would have had
// to wait: for the device (data not in the page cache, blocks to allocate,
// the file's timestamps to update in a new clock tick), for a lock, for the writer role, for a chunk rewrite, or for QoS tokens.
// The caller runs the request the ordinary way. A refused read changed
// nothing; a refused write changed nothing either, unless the kernel stored
// part of it before stopping (a short write), which the ordinary write then
// stores again: until a write is acknowledged its range holds old or new
// data, as with any write in flight.
var ErrWouldBlock = storage.ErrWouldBlock

// Nonblocking is implemented by disk handles that can try a read or a write
// without waiting (preadv2/pwritev2 with RWF_NOWAIT). A server runs such
// requests on the goroutine that decoded them, which saves two hand-offs
// and lets it answer a batch of requests with one write to the socket, and
// gives every other request to its workers.
//
// TryWriteAt makes the same promise as WriteAt without FUA: the data is in
// the page cache, durable after the next Flush.
type Nonblocking interface {
	TryReadAt(p []byte, off int64) error
	TryWriteAt(p []byte, off int64) error
}

var _ Nonblocking = (*liveDisk)(nil)

// noWait remembers whether the file's filesystem takes RWF_NOWAIT for
// buffered reads and writes (ext4 refuses it for writes, XFS and btrfs take
// it): once refused, Try requests fail at once.
type noWait struct {
	readOff, writeOff atomic.Bool
	sendOff           atomic.Bool // TrySendTo: the kernel has no cachestat(2)
}

func (d *liveDisk) TryReadAt(p []byte, off int64) error {
	if !d.v.gate.TryRLock() {
		return ErrWouldBlock
	}
	defer d.v.gate.RUnlock()
	df, err := d.file()
	if err != nil {
		return err
	}
	if err := checkRange(off, int64(len(p)), df.size); err != nil {
		return err
	}
	if df.nw.readOff.Load() || !df.fill.ready(off, int64(len(p)), false) || !df.enc.tryable(p, off, false) {
		return ErrWouldBlock
	}
	n, err := df.f.TryReadAt(p, off)
	err = df.nowaitResult(n, len(p), err, &df.nw.readOff)
	if err == nil && df.enc != nil {
		df.enc.decrypt(p, off)
	}
	return err
}

func (d *liveDisk) TryWriteAt(p []byte, off int64) error {
	if d.v.pool.writeHook != nil {
		return ErrWouldBlock // a test holds writes in flight
	}
	if !d.v.gate.TryRLock() {
		return ErrWouldBlock
	}
	defer d.v.gate.RUnlock()
	df, err := d.admitWrite(off, int64(len(p)))
	switch {
	case errors.Is(err, errMustClaim):
		return ErrWouldBlock // claiming takes the gate exclusively
	case err != nil:
		return err
	}
	n, err := d.tryWrite(df, p, off)
	if errors.Is(err, errWrittenHere) {
		return nil
	}
	return df.nowaitResult(n, len(p), err, &df.nw.writeOff)
}

// errWrittenHere says tryWrite did the write itself, in full.
var errWrittenHere = errors.New("written by the copy on write of a pinned chunk")

// tryWrite does what a Try write does once admitted (the gate held): into
// an owned chunk a write with RWF_NOWAIT; into a chunk wholly pinned by the
// disk's snapshot, one of its first writes, the copy on write itself
// (tryCopyOnWrite: errWrittenHere once done); else ErrWouldBlock.
func (d *liveDisk) tryWrite(df *diskFile, p []byte, off int64) (int, error) {
	n := int64(len(p))
	switch {
	case !df.fill.ready(off, n, true) || !df.enc.tryable(p, off, true):
		return 0, ErrWouldBlock
	case df.owned(off, n):
		if df.nw.writeOff.Load() {
			return 0, ErrWouldBlock
		}
		if df.chg != nil && !df.chg.tryMark(off, n) {
			return 0, ErrWouldBlock // its change must be written ahead first
		}
		d.v.markDirty(df.name, off, n)
		if df.enc != nil { // encrypted copies (encrypt.go)
			if err := df.enc.tryWrite(df, p, off); err != nil {
				return 0, err
			}
			return len(p), errWrittenHere
		}
		return df.f.TryWriteAt(p, off)
	case df.enc != nil:
		return 0, ErrWouldBlock // an encrypted disk's unowned chunks: the ordinary way
	}
	i, ok := df.pinnedCopyOnWrite(off, n)
	if !ok {
		return 0, ErrWouldBlock
	}
	m := &df.ch.locks[i%chunkStripes]
	if !m.TryLock() {
		return 0, ErrWouldBlock
	}
	defer m.Unlock()
	if df.ch.isOwned(i) || df.ch.cow[i] >= cowWrites || (df.chg != nil && !df.chg.tryMark(off, n)) {
		return 0, ErrWouldBlock
	}
	d.v.markDirty(df.name, off, n)
	if _, err := df.f.WriteAt(p, off); err != nil {
		return 0, err
	}
	df.cowWritten(i)
	return len(p), errWrittenHere
}

// owned reports whether every chunk of [off, off+length) is owned, so that
// a write there is a plain overwrite (always true without chunk ownership).
func (df *diskFile) owned(off, length int64) bool {
	c := df.ch
	if c == nil {
		return true
	}
	for i := off >> c.shift; i<<c.shift < off+length; i++ {
		if !c.isOwned(i) {
			return false
		}
	}
	return true
}

// nowaitResult maps the outcome of an RWF_NOWAIT call. A short transfer is
// a would-block too: the caller redoes the whole request, which for a read
// fills the buffer and for a write stores the same bytes again.
func (df *diskFile) nowaitResult(n, want int, err error, off *atomic.Bool) error {
	switch {
	case err == nil && n == want:
		return nil
	case err == nil, errors.Is(err, storage.ErrWouldBlock):
		return ErrWouldBlock
	case errors.Is(err, storage.ErrNotSupported):
		off.Store(true)
		return ErrWouldBlock
	default:
		return err
	}
}

// Sender is implemented by disk handles that can send a range from the page
// cache straight to a socket (storage.Sender, sendfile(2)), which saves
// the server both copies of a large READ. TrySendTo sends head, then the n
// bytes of the disk at off, to the connected blocking stream socket sock,
// all of it; it fails with ErrWouldBlock, having sent nothing, when it
// would have to wait for the device, a lock or QoS, or when the disk's file
// cannot do it (then the caller reads the ordinary way). It returns the
// bytes sent, head included: after a failure with some sent, the stream
// holds part of a reply and must be closed. It allocates nothing.
//
// The volume's gate is held (shared) until the data is in the socket's
// buffer, which waits for the peer to take the data when the buffer is
// full: a snapshot waits for that too, at most the socket's send timeout.
type Sender interface {
	TrySendTo(sock int, head []byte, off int64, n int) (int, error)
}

var _ Sender = (*liveDisk)(nil)

func (d *liveDisk) TrySendTo(sock int, head []byte, off int64, n int) (int, error) {
	if !d.v.gate.TryRLock() {
		return 0, ErrWouldBlock
	}
	defer d.v.gate.RUnlock()
	df, err := d.file()
	if err != nil {
		return 0, err
	}
	if err := checkRange(off, int64(n), df.size); err != nil {
		return 0, err
	}
	if !df.fill.ready(off, int64(n), false) || df.enc != nil { // sendfile would send ciphertext
		return 0, ErrWouldBlock
	}
	// Only the operating system's own file: a wrapper (a test's fault
	// injection, a crash-simulating twin) sees every read.
	s, ok := df.f.(storage.Sender)
	if !ok || df.nw.sendOff.Load() {
		return 0, ErrWouldBlock
	}
	sent, err := s.TrySendTo(sock, head, off, n)
	if sent == 0 && errors.Is(err, storage.ErrNotSupported) {
		df.nw.sendOff.Store(true)
		return 0, ErrWouldBlock
	}
	return sent, err
}

// IOUring reports whether batches (Batcher) go through io_uring: nil if
// they do, else why not (storage.IOUring). DisableIOUring, called first,
// switches it off.
func IOUring() error { return storage.IOUring() }

// DisableIOUring: see storage.DisableIOUring.
func DisableIOUring() { storage.DisableIOUring() }

// IO is one read or write of a batch (Batcher).
type IO = storage.IO

// Batcher is implemented by disk handles that try many reads and writes at
// once: one system call for a whole batch where the storage layer has
// io_uring (storage.IOUring). A server's reader batches the small READs and
// WRITEs it has decoded from one read of its socket.
type Batcher interface {
	// TryBatch tries every IO of ios whose Err is nil as TryReadAt or
	// TryWriteAt would, and stores the outcome in its Err: nil when done in
	// full (TryWriteAt's promise: in the page cache, durable after the next
	// Flush), ErrWouldBlock when the caller must run it the ordinary way,
	// or the error those would have returned. N is not meaningful. It
	// allocates nothing on success.
	TryBatch(ios []IO)
}

var _ Batcher = (*liveDisk)(nil)

func (d *liveDisk) TryBatch(ios []IO) {
	if !d.v.gate.TryRLock() {
		wouldBlock(ios)
		return
	}
	defer d.v.gate.RUnlock()
	df, err := d.file()
	if err != nil {
		for i := range ios {
			if ios[i].Err == nil {
				ios[i].Err = err
			}
		}
		return
	}
	for i := range ios {
		if io := &ios[i]; io.Err == nil {
			io.Err = d.admitTry(df, io)
		}
	}
	if df.enc != nil { // the writes go from encrypted copies (encrypt.go)
		eb := df.enc.prepareBatch(ios)
		defer df.enc.finishBatch(ios, eb)
	}
	if b, ok := df.f.(storage.Batcher); ok {
		b.TryBatch(ios)
	} else {
		for i := range ios {
			if io := &ios[i]; io.Err == nil {
				if io.Write {
					io.N, io.Err = df.f.TryWriteAt(io.P, io.Off)
				} else {
					io.N, io.Err = df.f.TryReadAt(io.P, io.Off)
				}
			}
		}
	}
	for i := range ios {
		io := &ios[i]
		if io.Err == errWrittenHere {
			io.Err = nil
			continue
		}
		off := &df.nw.readOff
		if io.Write {
			off = &df.nw.writeOff
		}
		io.Err = df.nowaitResult(io.N, len(io.P), io.Err, off)
		if io.Err == nil && !io.Write && df.enc != nil {
			df.enc.decrypt(io.P, io.Off)
		}
	}
}

// admitTry checks io as TryReadAt or TryWriteAt would before its system
// call; the gate is held.
func (d *liveDisk) admitTry(df *diskFile, io *IO) error {
	n := int64(len(io.P))
	if !io.Write {
		if err := checkRange(io.Off, n, df.size); err != nil {
			return err
		}
		if df.nw.readOff.Load() || !df.fill.ready(io.Off, n, false) || !df.enc.tryable(io.P, io.Off, false) {
			return ErrWouldBlock
		}
		return nil
	}
	if d.v.pool.writeHook != nil {
		return ErrWouldBlock // a test holds writes in flight
	}
	_, err := d.admitWrite(io.Off, n)
	switch {
	case errors.Is(err, errMustClaim):
		return ErrWouldBlock // claiming takes the gate exclusively
	case err != nil:
		return err
	case df.owned(io.Off, n):
		switch {
		case df.nw.writeOff.Load() || !df.fill.ready(io.Off, n, true) || !df.enc.batchable(io):
			return ErrWouldBlock
		case df.chg != nil && !df.chg.tryMark(io.Off, n):
			return ErrWouldBlock // its change must be written ahead first
		}
		d.v.markDirty(df.name, io.Off, n)
		return nil
	case df.enc != nil:
		return ErrWouldBlock // an encrypted disk's unowned chunks: the ordinary way
	}
	// A copy on write of a pinned chunk: done here, before the batch,
	// which then leaves it alone.
	io.N, err = d.tryWrite(df, io.P, io.Off)
	if err == nil {
		return ErrWouldBlock // tryWrite writes unowned chunks itself or not at all
	}
	return err
}

func wouldBlock(ios []IO) {
	for i := range ios {
		if ios[i].Err == nil {
			ios[i].Err = ErrWouldBlock
		}
	}
}
