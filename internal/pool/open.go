package pool

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/durable"
	"github.com/quiverstorage/quiver/internal/storage"
)

// lockFile is the pool's lock: held (flock) by the one process that has the
// pool open, for as long as it runs, and holding that process's PID.
const lockFile = "pool.lock"

// Options say how to open a pool.
type Options struct {
	Logger *slog.Logger // nil: slog.Default()
	// ExpectMount refuses a pool directory that is not a mount point (its
	// device is its parent's): the pool's filesystem is not mounted.
	ExpectMount bool
	// NoCreate refuses to make a new pool: the directory must hold one.
	NoCreate bool
	// FS is the pool directory seen through the storage layer; nil: the
	// operating system's (storage.OpenOS of the directory). Tests pass a
	// twin: internal/faultio injects faults, internal/storage/crashfs cuts
	// power. With FS set, dir only names the pool in messages, and
	// ExpectMount is not checked. The pool closes FS when it closes.
	FS storage.FS
	// NoUnshareGuard opens the pool without what keeps first writes into
	// unowned chunks on XFS from overwriting in place blocks another
	// file's copy on write just left to the image (unshare.go): after a
	// crash, one VM's data can appear in another's disk. Unsafe: only for
	// the benchmark that measures what the guard costs and the tests that
	// show what it prevents.
	NoUnshareGuard bool
	// Keyring holds the key providers that wrap and unwrap the data keys
	// of encrypted volumes (encrypt.go); nil: none, and creating an
	// encrypted volume fails with ErrNoKeyProvider. NewKeys names the
	// provider that makes the keys of new volumes ("": the only one).
	Keyring crypt.Keyring
	NewKeys string
}

// Open opens the pool at dir (see OpenWith) with default options.
func Open(ctx context.Context, dir string, log *slog.Logger) (*Pool, error) {
	return OpenWith(ctx, dir, Options{Logger: log})
}

// OpenWith opens the pool at dir. It first takes the pool's lock, so that
// one process at a time has a pool open, and fails with ErrLocked naming the
// holder otherwise; nothing in the pool is touched before. A directory
// without pool.json becomes a new pool only if it is empty (or absent) and
// opts.NoCreate is unset: anything else is refused with ErrNotPool, since a
// pool whose filesystem is not mounted, or that lost its identity, must not
// silently become a new, empty pool. A pool the process cannot write (a
// read-only mount, or a pool directory without write permission) opens
// read-only (see ReadOnly).
//
// Then it probes the filesystem, finishes or reclaims whatever a crash left
// half-done, and loads every volume and snapshot. A volume whose files are
// damaged or hostile is quarantined (VolumeInfo.Broken), not served and not
// touched; the others are served. Only what is on disk is needed: a pool
// directory moved to another machine opens with all its volumes.
func OpenWith(ctx context.Context, dir string, opts Options) (_ *Pool, err error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	fsys := opts.FS
	if fsys == nil {
		if !opts.ExpectMount && !opts.NoCreate {
			if err := storage.PrepareDir(abs); err != nil {
				return nil, fmt.Errorf("open pool %s: %w", abs, err)
			}
		}
		if opts.ExpectMount {
			if err := checkMounted(abs); err != nil {
				return nil, err
			}
		}
		if fsys, err = storage.OpenOS(abs); err != nil {
			return nil, fmt.Errorf("open pool %s: %w", abs, err)
		}
	}
	p := &Pool{dir: abs, fs: fsys, log: log, volumes: map[string]*Volume{}, creating: map[string]bool{},
		keyring: opts.Keyring, newKeys: opts.NewKeys}
	defer func() {
		if err != nil {
			if errors.Is(err, ErrNotPool) && p.lockCreated {
				_ = p.fs.Remove(lockFile) // leave a refused directory as it was
			}
			p.release()
		}
	}()
	p.readOnly = p.modeReadOnly()
	if err := p.takeLock(); err != nil {
		return nil, err
	}
	p.readOnly = p.readOnly || p.probeReadOnly()
	created, err := p.loadIdentity(opts.NoCreate)
	if err != nil {
		return nil, err
	}
	if err := p.checkLayout(); err != nil {
		return nil, err
	}
	if !p.readOnly {
		if p.caps, err = p.probeCaps(); err != nil {
			return nil, err
		}
	}
	if p.caps.Reflink {
		p.chunk = ChunkSize // chunks.go: keeps images cheap to clone
		if p.caps.Filesystem == "xfs" && !opts.NoUnshareGuard {
			if p.us, err = newUnsharer(p.fs, p.lock); err != nil {
				return nil, fmt.Errorf("open pool %s: %w", p.dir, err)
			}
		}
	}
	if err := p.recover(ctx); err != nil {
		return nil, err
	}
	if created {
		log.Warn("created a new, empty pool", "dir", p.dir, "id", p.id)
	}
	log.Info("pool open", "dir", p.dir, "id", p.id, "volumes", len(p.volumes), "broken", p.brokenCount(),
		"fs", p.caps.Filesystem, "reflink", p.caps.Reflink, "readOnly", p.readOnly)
	return p, nil
}

// Init makes a new, empty pool in dir (created if absent), which must be
// empty. It refuses a directory that already holds a pool or anything else.
func Init(ctx context.Context, dir string, log *slog.Logger) (*Pool, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if err := storage.PrepareDir(abs); err != nil {
		return nil, fmt.Errorf("init pool %s: %w", abs, err)
	}
	fsys, err := storage.OpenOS(abs)
	if err != nil {
		return nil, fmt.Errorf("init pool %s: %w", abs, err)
	}
	_, err = fsys.Lstat("pool.json")
	_ = fsys.Close()
	if err == nil {
		return nil, fmt.Errorf("init pool %s: already a pool (it has pool.json): %w", abs, ErrExists)
	}
	return OpenWith(ctx, abs, Options{Logger: log})
}

// release undoes a failed or finished open: the lock and the root.
func (p *Pool) release() {
	if p.lock != nil {
		_ = p.lock.Close() // closing the last descriptor drops the flock
		p.lock = nil
	}
	if p.fs != nil {
		_ = p.fs.Close()
		p.fs = nil
	}
}

// checkMounted refuses dir unless it is a mount point: a directory on the
// same device as its parent is an empty mount point whose filesystem is not
// mounted (or never was).
func checkMounted(dir string) error {
	mounted, err := storage.CheckMountPoint(dir)
	if err != nil {
		return fmt.Errorf("pool %s: %w (--expect-mount: the pool's filesystem must be mounted there)", dir, err)
	}
	if !mounted {
		return fmt.Errorf("pool %s is not a mount point (same device as %s): is its filesystem mounted? %w",
			dir, filepath.Dir(dir), ErrNotMounted)
	}
	return nil
}

// takeLock takes the pool's lock, exclusive and without waiting, on
// pool.lock (on the directory itself where the file cannot be created: a
// read-only pool), and writes this process's PID into it.
func (p *Pool) takeLock() error {
	f, err := p.fs.OpenFile(lockFile, os.O_RDWR, 0)
	if p.readOnly {
		err = storage.ErrReadOnly // take the lock without writing
	} else if errors.Is(err, fs.ErrNotExist) {
		f, err = p.fs.OpenFile(lockFile, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		p.lockCreated = err == nil
	}
	if isReadOnlyErr(err) {
		if f != nil {
			f.Close()
		}
		f, err = p.fs.OpenFile(lockFile, os.O_RDONLY, 0)
		if errors.Is(err, fs.ErrNotExist) {
			f, err = p.fs.OpenFile(".", os.O_RDONLY|storage.ODirectory, 0)
		}
	}
	if err != nil {
		return fmt.Errorf("lock pool %s: %w", p.dir, err)
	}
	if fi, err := f.Stat(); err == nil && !fi.IsDir() {
		if err := storage.CheckRegular(fi, f.Name()); err != nil {
			f.Close()
			return fmt.Errorf("lock pool %s: %w", p.dir, err)
		}
	}
	if err := f.Lock(); err != nil {
		defer f.Close()
		if errors.Is(err, storage.ErrLocked) {
			holder := "another process"
			b := make([]byte, 32)
			if n, _ := f.ReadAt(b, 0); n > 0 {
				// The PID line, then perhaps a hole (the unshare guard's
				// log forces change the file's size: unshare.go).
				line, _, _ := strings.Cut(string(b[:n]), "\n")
				if pid, perr := strconv.Atoi(strings.TrimSpace(line)); perr == nil && pid > 0 {
					holder = fmt.Sprintf("process %d", pid)
				}
			}
			return fmt.Errorf("pool %s is open in %s (another quiver server?): %w", p.dir, holder, ErrLocked)
		}
		return fmt.Errorf("lock pool %s: %w (on NFS, the lock needs NFSv4 or NFSv3 with the lock manager, not nolock)", p.dir, err)
	}
	if fi, err := f.Stat(); err == nil && !fi.IsDir() && !p.readOnly {
		if err := f.Truncate(0); err == nil {
			_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		}
	}
	p.lock = f
	return nil
}

// isReadOnlyErr reports an error that means "this cannot be written": a
// read-only filesystem or missing permission.
func isReadOnlyErr(err error) bool {
	return errors.Is(err, storage.ErrReadOnly) || errors.Is(err, fs.ErrPermission)
}

// modeReadOnly reports whether the pool directory has no write permission
// bits at all, which an operator sets to make a pool read-only even for root
// (who bypasses permission bits).
func (p *Pool) modeReadOnly() bool {
	fi, err := p.fs.Lstat(".")
	return err == nil && fi.Mode().Perm()&0o222 == 0
}

// probeReadOnly reports whether a probe file cannot be created in the pool
// (a read-only mount, no permission): the pool must be served read-only.
func (p *Pool) probeReadOnly() bool {
	name := durable.TempPrefix + "probe-" + newUID()
	f, err := p.fs.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return isReadOnlyErr(err)
	}
	f.Close()
	_ = p.fs.Remove(name)
	return false
}

// loadIdentity reads pool.json; in an empty directory it writes a new one
// (unless noCreate) and reports created.
func (p *Pool) loadIdentity(noCreate bool) (created bool, err error) {
	var m poolManifest
	err = p.readManifest("pool.json", &m)
	switch {
	case err == nil:
		if m.Kind != "Pool" || m.Version != manifestVersion || m.ID == "" {
			return false, fmt.Errorf("pool %s: pool.json: kind %q version %d id %q: want kind Pool, version %d and an id: %w",
				p.dir, m.Kind, m.Version, m.ID, manifestVersion, ErrNotPool)
		}
	case errors.Is(err, fs.ErrNotExist):
		if err := p.checkEmpty(); err != nil {
			return false, err
		}
		if noCreate {
			return false, fmt.Errorf("pool %s: no pool.json (make one with `quiver pool init`): %w", p.dir, ErrNotPool)
		}
		if p.readOnly {
			return false, fmt.Errorf("pool %s: no pool.json and the directory is read-only: %w", p.dir, ErrNotPool)
		}
		m = poolManifest{Kind: "Pool", Version: manifestVersion, ID: newUID(), CreatedAt: time.Now().UTC()}
		if err := p.writeJSON(filepath.Join(p.dir, "pool.json"), m); err != nil {
			return false, fmt.Errorf("create pool identity: %w", err)
		}
		created = true
	default:
		return false, fmt.Errorf("pool %s: read pool identity: %w", p.dir, err)
	}
	p.id, p.born = m.ID, m.CreatedAt
	return created, nil
}

// checkEmpty refuses to make a new pool in a directory that holds anything
// but the lock and what an interrupted first start leaves (temporary files).
func (p *Pool) checkEmpty() error {
	es, err := p.fs.ReadDir(".")
	if err != nil {
		return fmt.Errorf("pool %s: %w", p.dir, err)
	}
	var other []string
	for _, e := range es {
		if e.Name() == lockFile || durable.IsTemp(e.Name()) {
			continue
		}
		other = append(other, e.Name())
	}
	if len(other) == 0 {
		return nil
	}
	if len(other) > 5 {
		other = append(other[:5], "...")
	}
	return fmt.Errorf("pool %s has no pool.json but is not empty (%s): refusing to make a new pool over it; "+
		"if its filesystem is not mounted, mount it; if it lost pool.json, restore it; "+
		"for a new pool use an empty directory or `quiver pool init`: %w",
		p.dir, strings.Join(other, ", "), ErrNotPool)
}

// checkLayout makes volumes/ and staging/ where a writable pool lacks them
// and refuses a pool where either is anything but a directory (a symbolic
// link to elsewhere above all).
func (p *Pool) checkLayout() error {
	made := false
	for _, d := range []string{"volumes", "staging"} {
		fi, err := p.fs.Lstat(d)
		if errors.Is(err, fs.ErrNotExist) && !p.readOnly {
			if err := p.fs.Mkdir(d, 0o755); err != nil {
				return fmt.Errorf("open pool %s: %w", p.dir, err)
			}
			made = true
			continue
		}
		if err != nil {
			return fmt.Errorf("open pool %s: %w", p.dir, err)
		}
		if !fi.IsDir() {
			return fmt.Errorf("open pool %s: %s is a %s, not a directory: refusing to use it: %w",
				p.dir, d, kindOf(fi), ErrHostile)
		}
	}
	// The new directories must be durable before anything is put in
	// them: volumes published into a volumes/ that a crash loses are lost
	// with it.
	if made {
		if err := p.fs.SyncDir("."); err != nil {
			return fmt.Errorf("open pool %s: %w", p.dir, err)
		}
	}
	return nil
}

// kindOf names what a file is, for messages.
func kindOf(fi fs.FileInfo) string {
	switch m := fi.Mode(); {
	case m&fs.ModeSymlink != 0:
		return "symbolic link"
	case m.IsDir():
		return "directory"
	case m.IsRegular():
		return "regular file"
	default:
		return "special file"
	}
}

// rel returns path relative to the pool directory, for p.fs.
func (p *Pool) rel(path string) string {
	r, err := filepath.Rel(p.dir, path)
	if err != nil {
		return path // absolute: beneath refuses it
	}
	return r
}

// ReadOnly reports whether the pool is served read-only: every change is
// refused with ErrReadOnly and disks are opened read-only.
func (p *Pool) ReadOnly() bool { return p.readOnly }

// diskFlag is how live disks are opened: read-only on a read-only pool.
func (p *Pool) diskFlag() int {
	if p.readOnly {
		return os.O_RDONLY
	}
	return os.O_RDWR
}

// checkWritable refuses a change to a read-only pool.
func (p *Pool) checkWritable(op string) error {
	if p.readOnly {
		return fmt.Errorf("%s: pool %s is read-only: %w", op, p.dir, ErrReadOnly)
	}
	return nil
}
