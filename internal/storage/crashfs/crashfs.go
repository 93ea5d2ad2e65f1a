// Package crashfs is the strict crash twin of the storage layer
// (internal/storage): an in-memory FS that keeps what is durable apart from
// what is not, and can cut the power.
//
//   - A file's data (content and size) is durable up to its last Sync.
//   - A create, mkdir, remove or rename is durable once every directory it
//     changed has been synced after it (SyncDir): a create or remove needs
//     its directory's sync, a rename between two directories the syncs of
//     both. Until then a power cut undoes it whole, so a rename is never
//     half done, but one synced directory is not enough.
//
// CutPower throws away everything that is not durable (optionally keeping a
// seeded random subset of the unsynced 4 KiB blocks of each file, as a disk
// may have written some of them) and turns the FS off: every later call fails
// with EIO, as nothing reaches a disk without power. Reboot turns it on
// again, holding only what survived, for the pool to be reopened on it.
//
// Every sync point is counted and recorded with its label
// (storage.SyncLabel); CutAtSync cuts the power right before or right after
// the k-th one, so a test can cut an operation at each of its syncs in turn.
// A sync switched off by the mutation check (storage.SkipSync) does nothing
// and is not counted, as if it were not in the code.
//
// The twin reports reflink (a clone is a copy here) and no hole reporting;
// extent size hints and Solid are not supported.
//
// Imports from quiver: storage.
package crashfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/quiverstorage/quiver/internal/storage"
)

// blockSize is the unit in which unsynced data survives a cut.
const blockSize = 4096

// inode is a file or directory.
type inode struct {
	dir  bool
	mode fs.FileMode
	// file: data is what reads see, synced what survives a cut.
	data, synced []byte
	// dir: entries is what lookups see, durable what survives a cut.
	entries, durable map[string]*inode
	locked           *file // the open file holding the lock
}

func newDir(mode fs.FileMode) *inode {
	return &inode{dir: true, mode: mode, entries: map[string]*inode{}, durable: map[string]*inode{}}
}

// op is a directory change not yet durable: it becomes durable, and is
// applied to the durable entries, once every directory in waits has been
// synced after it.
type op struct {
	waits []*inode
	apply func()
}

// SyncPoint is one sync the FS saw.
type SyncPoint struct {
	N     int    // 1-based
	Label string // storage.SyncLabel
	Dir   bool   // a directory sync
	Path  string
}

// FS is the twin. It is safe for concurrent use; every call takes one lock.
type FS struct {
	mu      sync.Mutex
	path    string
	root    *inode
	pending []*op
	gen     int // bumped by Reboot: files of an earlier boot fail
	off     bool
	image   *inode // what survived the cut, until Reboot
	syncs   []SyncPoint
	cutAt   int  // cut at this sync number, 0: never
	cutLate bool // after the sync rather than before
	seed    uint64
	partial bool // keep a random subset of unsynced blocks at a cut
	onSync  func(SyncPoint)
}

var (
	_ storage.FS   = (*FS)(nil)
	_ storage.File = (*file)(nil)
)

// New returns an empty, synced FS; path names it in messages.
func New(path string) *FS {
	return &FS{path: path, root: newDir(0o755)}
}

// KeepPartial makes cuts keep a random subset of each file's unsynced
// blocks (drawn from seed), as a disk may have written some of them; by
// default a cut keeps none.
func (f *FS) KeepPartial(seed uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.partial, f.seed = true, seed
}

// CutAtSync arms a power cut at the k-th sync point from the start
// (counting every sync since New): before it runs, or right after it
// returned when after is set. 0 disarms.
func (f *FS) CutAtSync(k int, after bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cutAt, f.cutLate = k, after
}

// OnSync calls fn (with the FS's lock held: fn must not call the FS) at
// every sync point.
func (f *FS) OnSync(fn func(SyncPoint)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.onSync = fn
}

// Syncs returns the sync points seen so far.
func (f *FS) Syncs() []SyncPoint {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.syncs)
}

// Off reports whether the power is cut.
func (f *FS) Off() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.off
}

// CutPower cuts the power now: what is not durable is lost, and every call
// fails until Reboot.
func (f *FS) CutPower() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cutLocked()
}

func (f *FS) cutLocked() {
	if f.off {
		return
	}
	rng := rand.New(rand.NewPCG(f.seed, uint64(len(f.syncs))))
	seen := map[*inode]*inode{}
	f.image = f.survivor(f.root, seen, rng)
	f.off = true
}

// survivor returns the durable copy of n: a directory with its durable
// entries, a file with its synced data (and, with partial, some unsynced
// blocks).
func (f *FS) survivor(n *inode, seen map[*inode]*inode, rng *rand.Rand) *inode {
	if c, ok := seen[n]; ok {
		return c // a hard link
	}
	if n.dir {
		c := newDir(n.mode)
		seen[n] = c
		names := make([]string, 0, len(n.durable))
		for name := range n.durable {
			names = append(names, name)
		}
		slices.Sort(names) // a seeded cut is reproducible
		for _, name := range names {
			e := f.survivor(n.durable[name], seen, rng)
			c.entries[name], c.durable[name] = e, e
		}
		return c
	}
	data := slices.Clone(n.synced)
	if f.partial && !slices.Equal(n.data, n.synced) {
		if rng.IntN(2) == 0 {
			data = resize(data, len(n.data))
		}
		for b := 0; b < len(data); b += blockSize {
			end := min(b+blockSize, len(data), len(n.data))
			if b < end && rng.IntN(2) == 0 {
				copy(data[b:end], n.data[b:end])
			}
		}
	}
	c := &inode{mode: n.mode, data: data, synced: slices.Clone(data)}
	seen[n] = c
	return c
}

// Reboot turns the power on again after a cut: the FS then holds what
// survived it, all of it durable, with no lock held and no file open.
// Counting of sync points goes on; an armed cut is disarmed.
func (f *FS) Reboot() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.off {
		f.cutLocked()
	}
	f.root, f.image, f.pending, f.off = f.image, nil, nil, false
	f.cutAt = 0
	f.gen++
}

// Tree lists every path in the FS (directories with a trailing "/"),
// sorted, as reads see them now.
func (f *FS) Tree() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	var walk func(n *inode, p string)
	walk = func(n *inode, p string) {
		for name, e := range n.entries {
			q := path.Join(p, name)
			if e.dir {
				out = append(out, q+"/")
				walk(e, q)
			} else {
				out = append(out, q)
			}
		}
	}
	walk(f.root, "")
	slices.Sort(out)
	return out
}

// errOff is what every call gets while the power is off.
func (f *FS) errOff(op, name string) error {
	return storage.Classify(&fs.PathError{Op: op, Path: path.Join(f.path, name), Err: unix.EIO})
}

func pathErr(op, name string, err error) error {
	return storage.Classify(&fs.PathError{Op: op, Path: name, Err: err})
}

// lookup resolves rel (clean, relative) to its parent directory and the
// entry's name; the parent must exist.
func (f *FS) lookup(rel string) (parent *inode, name string, err error) {
	rel, err = clean(rel)
	if err != nil {
		return nil, "", err
	}
	if rel == "." {
		return nil, ".", nil
	}
	dir, name := path.Split(rel)
	parent = f.root
	if dir != "" {
		for _, c := range strings.Split(strings.TrimSuffix(dir, "/"), "/") {
			next, ok := parent.entries[c]
			if !ok {
				return nil, "", pathErr("open", rel, unix.ENOENT)
			}
			if !next.dir {
				return nil, "", pathErr("open", rel, unix.ENOTDIR)
			}
			parent = next
		}
	}
	return parent, name, nil
}

// node resolves rel to its inode.
func (f *FS) node(rel string) (*inode, error) {
	parent, name, err := f.lookup(rel)
	if err != nil {
		return nil, err
	}
	if parent == nil {
		return f.root, nil
	}
	n, ok := parent.entries[name]
	if !ok {
		return nil, pathErr("open", rel, unix.ENOENT)
	}
	return n, nil
}

func clean(rel string) (string, error) {
	if rel == "" || rel == "." {
		return ".", nil
	}
	if path.IsAbs(rel) || slices.Contains(strings.Split(rel, "/"), "..") {
		return "", fmt.Errorf("%q: %w", rel, storage.ErrEscape)
	}
	return path.Clean(rel), nil
}

// change records a directory change: done now for reads, durable once
// every directory in waits is synced.
func (f *FS) change(apply func(), waits ...*inode) {
	f.pending = append(f.pending, &op{waits: slices.Compact(waits), apply: apply})
}

func (f *FS) Path() string { return f.path }
func (f *FS) Close() error { return nil }

func (f *FS) OpenFile(rel string, flag int, perm fs.FileMode) (storage.File, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.off {
		return nil, f.errOff("open", rel)
	}
	parent, name, err := f.lookup(rel)
	if err != nil {
		return nil, err
	}
	var n *inode
	if parent == nil {
		n = f.root
	} else {
		n = parent.entries[name]
	}
	switch {
	case n == nil && flag&os.O_CREATE == 0:
		return nil, pathErr("open", rel, unix.ENOENT)
	case n == nil:
		n = &inode{mode: perm.Perm()}
		parent.entries[name] = n
		p := parent
		f.change(func() { p.durable[name] = n }, p)
	case flag&(os.O_CREATE|os.O_EXCL) == os.O_CREATE|os.O_EXCL:
		return nil, pathErr("open", rel, unix.EEXIST)
	case n.dir && flag&(os.O_WRONLY|os.O_RDWR) != 0:
		return nil, pathErr("open", rel, unix.EISDIR)
	case !n.dir && flag&storage.ODirectory != 0:
		return nil, pathErr("open", rel, unix.ENOTDIR)
	}
	if flag&os.O_TRUNC != 0 && !n.dir {
		n.data = n.data[:0]
	}
	return &file{fs: f, n: n, name: path.Join(f.path, rel), gen: f.gen}, nil
}

func (f *FS) OpenRegular(rel string, flag int) (storage.File, error) {
	sf, err := f.OpenFile(rel, flag&^os.O_CREATE, 0)
	if err != nil {
		return nil, err
	}
	if sf.(*file).n.dir {
		sf.Close()
		return nil, &fs.PathError{Op: "open", Path: rel, Err: storage.ErrNotRegular}
	}
	return sf, nil
}

func (f *FS) ReadDir(rel string) ([]fs.DirEntry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.off {
		return nil, f.errOff("readdir", rel)
	}
	n, err := f.node(rel)
	if err != nil {
		return nil, err
	}
	if !n.dir {
		return nil, pathErr("readdir", rel, unix.ENOTDIR)
	}
	out := make([]fs.DirEntry, 0, len(n.entries))
	for name, e := range n.entries {
		out = append(out, fs.FileInfoToDirEntry(info(name, e)))
	}
	slices.SortFunc(out, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return out, nil
}

func (f *FS) Lstat(rel string) (fs.FileInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.off {
		return nil, f.errOff("lstat", rel)
	}
	n, err := f.node(rel)
	if err != nil {
		return nil, err
	}
	return info(path.Base(rel), n), nil
}

func (f *FS) Mkdir(rel string, perm fs.FileMode) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.off {
		return f.errOff("mkdir", rel)
	}
	parent, name, err := f.lookup(rel)
	if err != nil {
		return err
	}
	if parent == nil || parent.entries[name] != nil {
		return pathErr("mkdir", rel, unix.EEXIST)
	}
	n := newDir(perm.Perm())
	parent.entries[name] = n
	f.change(func() { parent.durable[name] = n }, parent)
	return nil
}

func (f *FS) Remove(rel string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.off {
		return f.errOff("remove", rel)
	}
	parent, name, err := f.lookup(rel)
	if err != nil {
		return err
	}
	if parent == nil {
		return pathErr("remove", rel, unix.EBUSY)
	}
	n, ok := parent.entries[name]
	if !ok {
		return pathErr("remove", rel, unix.ENOENT)
	}
	if n.dir && len(n.entries) > 0 {
		return pathErr("remove", rel, unix.ENOTEMPTY)
	}
	f.unlink(parent, name, n)
	return nil
}

func (f *FS) unlink(parent *inode, name string, n *inode) {
	delete(parent.entries, name)
	f.change(func() {
		if parent.durable[name] == n {
			delete(parent.durable, name)
		}
	}, parent)
}

func (f *FS) RemoveAll(rel string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.off {
		return f.errOff("remove", rel)
	}
	parent, name, err := f.lookup(rel)
	if storage.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if parent == nil {
		return fmt.Errorf("remove %s: refusing to remove the root", f.path)
	}
	n, ok := parent.entries[name]
	if !ok {
		return nil
	}
	f.removeTree(n)
	f.unlink(parent, name, n)
	return nil
}

func (f *FS) removeTree(n *inode) {
	if !n.dir {
		return
	}
	for name, e := range n.entries {
		f.removeTree(e)
		f.unlink(n, name, e)
	}
}

func (f *FS) Rename(oldrel, newrel string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.off {
		return f.errOff("rename", oldrel)
	}
	op, on, err := f.lookup(oldrel)
	if err != nil {
		return err
	}
	np, nn, err := f.lookup(newrel)
	if err != nil {
		return err
	}
	if op == nil || np == nil {
		return pathErr("rename", oldrel, unix.EBUSY)
	}
	n, ok := op.entries[on]
	if !ok {
		return pathErr("rename", oldrel, unix.ENOENT)
	}
	if old, ok := np.entries[nn]; ok {
		switch {
		case old == n:
			return nil
		case old.dir && (!n.dir || len(old.entries) > 0):
			return pathErr("rename", newrel, unix.ENOTEMPTY)
		case !old.dir && n.dir:
			return pathErr("rename", newrel, unix.ENOTDIR)
		}
	}
	delete(op.entries, on)
	np.entries[nn] = n
	f.change(func() {
		if op.durable[on] == n {
			delete(op.durable, on)
		}
		np.durable[nn] = n
	}, op, np)
	return nil
}

// syncPoint counts a sync and cuts the power when one is armed for it. It
// returns false when the sync must not run (the power is off now).
func (f *FS) syncPoint(label, name string, dir bool) bool {
	sp := SyncPoint{N: len(f.syncs) + 1, Label: label, Dir: dir, Path: name}
	f.syncs = append(f.syncs, sp)
	if f.onSync != nil {
		f.onSync(sp)
	}
	if sp.N == f.cutAt && !f.cutLate {
		f.cutLocked()
		return false
	}
	return true
}

// afterSync cuts the power when a cut is armed right after this sync.
func (f *FS) afterSync() {
	if len(f.syncs) == f.cutAt && f.cutLate {
		f.cutLocked()
	}
}

func (f *FS) SyncDir(rel string) error {
	label := storage.SyncLabel()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.off {
		return f.errOff("sync dir", rel)
	}
	n, err := f.node(rel)
	if err != nil {
		return err
	}
	if storage.SkipSync() {
		return nil
	}
	if !f.syncPoint(label, rel, true) {
		return f.errOff("sync dir", rel)
	}
	kept := f.pending[:0]
	for _, o := range f.pending {
		o.waits = slices.DeleteFunc(o.waits, func(w *inode) bool { return w == n })
		if len(o.waits) == 0 {
			o.apply()
		} else {
			kept = append(kept, o)
		}
	}
	clear(f.pending[len(kept):])
	f.pending = kept
	f.afterSync()
	return nil
}

func (f *FS) Usage() (int64, int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.off {
		return 0, 0, f.errOff("statfs", ".")
	}
	return 1 << 40, 1 << 39, nil
}

func (f *FS) Allocated(rel string) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, err := f.node(rel)
	if err != nil {
		return 0, err
	}
	return int64(len(n.data)), nil
}

// Extents is not modelled: the twin has no device addresses.
func (f *FS) Extents(rel string) ([]storage.Extent, error) {
	return nil, fmt.Errorf("extents of %s in the crash twin: %w", rel, storage.ErrNotSupported)
}

func (f *FS) Probe(string) (storage.Caps, error) {
	return storage.Caps{Filesystem: "crashfs", Reflink: true}, nil
}

// fileInfo describes an inode.
type fileInfo struct {
	name string
	n    *inode
	size int64
}

func info(name string, n *inode) fs.FileInfo {
	return &fileInfo{name: name, n: n, size: int64(len(n.data))}
}

func (i *fileInfo) Name() string       { return i.name }
func (i *fileInfo) Size() int64        { return i.size }
func (i *fileInfo) ModTime() time.Time { return time.Time{} }
func (i *fileInfo) IsDir() bool        { return i.n.dir }
func (i *fileInfo) Sys() any           { return nil }
func (i *fileInfo) Mode() fs.FileMode {
	if i.n.dir {
		return fs.ModeDir | i.n.mode
	}
	return i.n.mode
}

// file is an open file of the twin.
type file struct {
	fs   *FS
	n    *inode
	name string
	gen  int
}

// check fails calls while the power is off or on a file of an earlier
// boot; the caller holds the FS's lock.
func (h *file) check(op string) error {
	if h.fs.off || h.gen != h.fs.gen {
		return pathErr(op, h.name, unix.EIO)
	}
	return nil
}

func (h *file) lock(op string) (func(), error) {
	h.fs.mu.Lock()
	if err := h.check(op); err != nil {
		h.fs.mu.Unlock()
		return nil, err
	}
	return h.fs.mu.Unlock, nil
}

func (h *file) Name() string { return h.name }

func (h *file) Stat() (fs.FileInfo, error) {
	unlock, err := h.lock("stat")
	if err != nil {
		return nil, err
	}
	defer unlock()
	return info(path.Base(h.name), h.n), nil
}

func (h *file) ReadAt(p []byte, off int64) (int, error) {
	unlock, err := h.lock("read")
	if err != nil {
		return 0, err
	}
	defer unlock()
	if off >= int64(len(h.n.data)) {
		return 0, io.EOF
	}
	n := copy(p, h.n.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func resize(b []byte, size int) []byte {
	if size <= len(b) {
		return b[:size]
	}
	return append(b, make([]byte, size-len(b))...)
}

func (h *file) WriteAt(p []byte, off int64) (int, error) {
	unlock, err := h.lock("write")
	if err != nil {
		return 0, err
	}
	defer unlock()
	if end := int(off) + len(p); end > len(h.n.data) {
		h.n.data = resize(h.n.data, end)
	}
	copy(h.n.data[off:], p)
	return len(p), nil
}

func (h *file) TryReadAt([]byte, int64) (int, error)  { return 0, storage.ErrWouldBlock }
func (h *file) TryWriteAt([]byte, int64) (int, error) { return 0, storage.ErrWouldBlock }

func (h *file) Truncate(size int64) error {
	unlock, err := h.lock("truncate")
	if err != nil {
		return err
	}
	defer unlock()
	h.n.data = resize(h.n.data, int(size))
	if size < int64(len(h.n.data)) {
		h.n.data = h.n.data[:size]
	}
	return nil
}

func (h *file) Sync() error {
	label := storage.SyncLabel()
	unlock, err := h.lock("fdatasync")
	if err != nil {
		return err
	}
	defer unlock()
	if storage.SkipSync() {
		return nil
	}
	if !h.fs.syncPoint(label, h.name, false) {
		return pathErr("fdatasync", h.name, unix.EIO)
	}
	h.n.synced = slices.Clone(h.n.data)
	h.fs.afterSync()
	return nil
}

func (h *file) zero(off, length int64) error {
	unlock, err := h.lock("fallocate")
	if err != nil {
		return err
	}
	defer unlock()
	end := min(off+length, int64(len(h.n.data)))
	if off < end {
		clear(h.n.data[off:end])
	}
	return nil
}

func (h *file) Punch(off, length int64) error     { return h.zero(off, length) }
func (h *file) ZeroRange(off, length int64) error { return h.zero(off, length) }

func (h *file) SeekData(int64) (int64, error) {
	return 0, &storage.Error{Kind: storage.ErrNotSupported, Err: errors.New("crashfs reports no holes")}
}

func (h *file) SeekHole(int64) (int64, error) {
	return 0, &storage.Error{Kind: storage.ErrNotSupported, Err: errors.New("crashfs reports no holes")}
}

// twin returns src as a file of the same FS.
func (h *file) twin(src storage.File) (*file, error) {
	s, ok := storage.Unwrap(src).(*file)
	if !ok || s.fs != h.fs {
		return nil, &storage.Error{Kind: storage.ErrNotSupported, Err: errors.New("not a file of this crashfs")}
	}
	return s, nil
}

func (h *file) Clone(src storage.File) error {
	s, err := h.twin(src)
	if err != nil {
		return err
	}
	unlock, err := h.lock("clone")
	if err != nil {
		return err
	}
	defer unlock()
	h.n.data = slices.Clone(s.n.data)
	return nil
}

func (h *file) CloneRange(src storage.File, off, length int64) error {
	s, err := h.twin(src)
	if err != nil {
		return err
	}
	unlock, err := h.lock("clone")
	if err != nil {
		return err
	}
	defer unlock()
	end := int64(len(s.n.data))
	if length > 0 {
		end = min(off+length, end)
	}
	if off >= end {
		return nil
	}
	if int(end) > len(h.n.data) {
		h.n.data = resize(h.n.data, int(end))
	}
	copy(h.n.data[off:end], s.n.data[off:end])
	return nil
}

func (h *file) CopyRange(storage.File, int64, int64) (int64, error) {
	return 0, &storage.Error{Kind: storage.ErrNotSupported, Err: errors.New("crashfs copies through WriteAt")}
}

func (h *file) Solid(int64, int64) (bool, error) {
	return false, &storage.Error{Kind: storage.ErrNotSupported, Err: errors.New("crashfs has no extent map")}
}

func (h *file) Sharing(int64, int64) (bool, bool, error) {
	return false, false, &storage.Error{Kind: storage.ErrNotSupported, Err: errors.New("crashfs has no extent map")}
}

func (h *file) Differences(storage.File, int64) ([][2]int64, error) {
	return nil, &storage.Error{Kind: storage.ErrNotSupported, Err: errors.New("crashfs has no extent map")}
}

func (h *file) SharedBlocks(storage.File, int64) ([][2]int64, error) {
	return nil, &storage.Error{Kind: storage.ErrNotSupported, Err: errors.New("crashfs has no extent map")}
}

func (h *file) SameBlocks(storage.File, int64, int64) (bool, error) {
	return false, &storage.Error{Kind: storage.ErrNotSupported, Err: errors.New("crashfs has no extent map")}
}

func (h *file) SetExtentSizeHint(uint32) error {
	return &storage.Error{Kind: storage.ErrNotSupported, Err: errors.New("crashfs has no extent size hint")}
}

func (h *file) SetCowExtentSize(uint32) error {
	return &storage.Error{Kind: storage.ErrNotSupported, Err: errors.New("crashfs has no copy-on-write extent size")}
}

func (h *file) CowExtentSize() (uint32, error) {
	return 0, &storage.Error{Kind: storage.ErrNotSupported, Err: errors.New("crashfs has no copy-on-write extent size")}
}

func (h *file) Advise(int64, int64, storage.Advice) error { return nil }

func (h *file) Chmod(m fs.FileMode) error {
	unlock, err := h.lock("chmod")
	if err != nil {
		return err
	}
	defer unlock()
	h.n.mode = m.Perm()
	return nil
}

func (h *file) Lock() error {
	unlock, err := h.lock("flock")
	if err != nil {
		return err
	}
	defer unlock()
	if h.n.locked != nil && h.n.locked != h && h.n.locked.gen == h.fs.gen {
		return &storage.Error{Kind: storage.ErrLocked, Err: unix.EWOULDBLOCK}
	}
	h.n.locked = h
	return nil
}

func (h *file) Close() error {
	h.fs.mu.Lock()
	defer h.fs.mu.Unlock()
	if h.n.locked == h {
		h.n.locked = nil
	}
	return nil
}
