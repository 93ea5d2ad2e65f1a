package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sync"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/storage"
)

// Dir is the log's directory in the pool's root.
const Dir = "audit"

// current is the file appended to; rotated files are events.1.jsonl (the
// newest) to events.<MaxFiles-1>.jsonl (the oldest).
const current = "events.jsonl"

func rotated(i int) string { return fmt.Sprintf("events.%d.jsonl", i) }

// Defaults and bounds of Options.
const (
	DefaultMaxFileBytes = 8 << 20
	DefaultMaxFiles     = 4
	minFileBytes        = 4 << 10
	// MaxName bounds each name of an event (a longer one is cut): the
	// names come from request paths and bodies, which the client chooses.
	MaxName = 256
)

// Options bound the log's disk use: at most MaxFiles files of at most
// MaxFileBytes each (a line larger than MaxFileBytes alone still makes
// one file).
type Options struct {
	MaxFileBytes int64 // 0: DefaultMaxFileBytes; at least 4 KiB
	MaxFiles     int   // 0: DefaultMaxFiles; at least 2 (the current file and one rotated)
}

// Log is a node's audit log: one api.Event per line (JSON) in the pool's
// audit/ directory, rotated by size, with a bounded number of files. It is
// safe for concurrent use.
//
// Durability: Append writes the event's line and fsyncs the file before it
// returns, so an event is on disk before the API answers the request it
// records (the caller appends before its response completes). A new file's
// directory entry is synced when the file is made. A failed write or fsync
// is final for that file: Append returns the error, and the next Append
// rotates the file away and starts a new one, never writing the failed
// file again (whatever it kept stays readable as it is).
type Log struct {
	fsys storage.FS
	opts Options

	mu     sync.Mutex
	f      storage.File // the current file; nil after a failure or Close
	size   int64
	seq    int64 // the last event's
	failed bool  // the current file had a failed write or fsync
	closed bool
}

// Open opens the log in fsys (the pool's root), making audit/ and the
// current file as needed. A line cut short by a crash at the end of the
// current file is dropped; numbering goes on from the last event kept.
func Open(fsys storage.FS, opts Options) (*Log, error) {
	if opts.MaxFileBytes == 0 {
		opts.MaxFileBytes = DefaultMaxFileBytes
	}
	if opts.MaxFiles == 0 {
		opts.MaxFiles = DefaultMaxFiles
	}
	if opts.MaxFileBytes < minFileBytes || opts.MaxFiles < 2 {
		return nil, fmt.Errorf("audit log: %d files of %d bytes: want at least 2 files of at least %d bytes",
			opts.MaxFiles, opts.MaxFileBytes, minFileBytes)
	}
	if err := fsys.Mkdir(Dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	l := &Log{fsys: fsys, opts: opts}
	for i := 0; i < opts.MaxFiles && l.seq == 0; i++ {
		name := current
		if i > 0 {
			name = rotated(i)
		}
		evs, _, err := l.readFile(name)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("audit log: %w", err)
		}
		if len(evs) > 0 {
			l.seq = evs[len(evs)-1].Seq
		}
	}
	if err := l.openCurrent(); err != nil {
		return nil, fmt.Errorf("audit log: %w", err)
	}
	return l, nil
}

// openCurrent opens the current file (making it, and syncing the
// directory, when absent) and cuts a partial last line.
func (l *Log) openCurrent() error {
	rel := path.Join(Dir, current)
	_, statErr := l.fsys.Lstat(rel)
	f, err := l.fsys.OpenFile(rel, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	if errors.Is(statErr, fs.ErrNotExist) {
		if err := l.fsys.SyncDir(Dir); err != nil {
			f.Close()
			return err
		}
	}
	_, whole, err := l.readFile(current)
	if err != nil {
		f.Close()
		return err
	}
	if fi, err := f.Stat(); err == nil && fi.Size() != whole {
		if err := f.Truncate(whole); err != nil {
			f.Close()
			return err
		}
	}
	l.f, l.size, l.failed = f, whole, false
	return nil
}

// Append gives ev the next number, writes it as one line and syncs it:
// durable when Append returns nil.
func (l *Log) Append(ev api.Event) error {
	for k, v := range ev.Names {
		if len(v) > MaxName {
			ev.Names[k] = v[:MaxName]
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("audit log: %w", fs.ErrClosed)
	}
	ev.Seq = l.seq + 1
	line, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	line = append(line, '\n')
	if l.f == nil || l.failed || (l.size > 0 && l.size+int64(len(line)) > l.opts.MaxFileBytes) {
		if err := l.rotate(); err != nil {
			return fmt.Errorf("audit log: rotate: %w", err)
		}
	}
	if _, err := l.f.WriteAt(line, l.size); err != nil {
		l.failed = true
		return fmt.Errorf("audit log: write: %w", err)
	}
	if err := l.f.Sync(); err != nil {
		l.failed = true
		return fmt.Errorf("audit log: sync: %w", err)
	}
	l.size += int64(len(line))
	l.seq = ev.Seq
	return nil
}

// rotate moves the current file to events.1.jsonl, each rotated file one
// older, drops the oldest beyond MaxFiles, and starts a new current file.
// A current file that is empty and sound is kept as it is.
func (l *Log) rotate() error {
	if l.f != nil && l.size == 0 && !l.failed {
		return nil
	}
	if l.f != nil {
		_ = l.f.Close()
		l.f = nil
	}
	if _, err := l.fsys.Lstat(path.Join(Dir, current)); err == nil {
		oldest := path.Join(Dir, rotated(l.opts.MaxFiles-1))
		if err := l.fsys.Remove(oldest); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		for i := l.opts.MaxFiles - 2; i >= 1; i-- {
			err := l.fsys.Rename(path.Join(Dir, rotated(i)), path.Join(Dir, rotated(i+1)))
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
		if err := l.fsys.Rename(path.Join(Dir, current), path.Join(Dir, rotated(1))); err != nil {
			return err
		}
	}
	return l.openCurrent()
}

// Query selects events: those numbered after After, at or after Since,
// that Keep keeps (nil: all); of them the last Limit (0: all).
type Query struct {
	After int64
	Since time.Time
	Keep  func(api.Event) bool
	Limit int
}

// Read returns the events q selects, oldest first. A line that does not
// decode (damage) is skipped.
func (l *Log) Read(q Query) ([]api.Event, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []api.Event
	for i := l.opts.MaxFiles - 1; i >= 0; i-- {
		name := current
		if i > 0 {
			name = rotated(i)
		}
		evs, _, err := l.readFile(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("audit log: %w", err)
		}
		for _, ev := range evs {
			if ev.Seq <= q.After || ev.Time.Before(q.Since) || (q.Keep != nil && !q.Keep(ev)) {
				continue
			}
			out = append(out, ev)
			if q.Limit > 0 && len(out) > 2*q.Limit {
				out = append(out[:0], out[len(out)-q.Limit:]...)
			}
		}
	}
	if q.Limit > 0 && len(out) > q.Limit {
		out = out[len(out)-q.Limit:]
	}
	return out, nil
}

// readFile decodes the complete lines of audit/name and returns the
// length of those lines in bytes.
func (l *Log) readFile(name string) ([]api.Event, int64, error) {
	f, err := l.fsys.OpenRegular(path.Join(Dir, name), os.O_RDONLY)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	// A file is at most MaxFileBytes, or one line over it.
	r := bufio.NewReader(io.NewSectionReader(f, 0, 1<<40))
	var evs []api.Event
	var whole int64
	for {
		line, err := r.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			return evs, whole, nil // a last line without '\n' is cut short
		}
		if err != nil {
			return nil, 0, err
		}
		whole += int64(len(line))
		var ev api.Event
		if json.Unmarshal(bytes.TrimSpace(line), &ev) == nil {
			evs = append(evs, ev)
		}
	}
}

// Close closes the current file; Append fails from then on.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
