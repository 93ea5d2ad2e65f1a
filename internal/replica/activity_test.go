package replica

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/faultio"
	"github.com/quiverstorage/quiver/internal/storage"
	"github.com/quiverstorage/quiver/internal/storage/crashfs"
)

const testExtent = 64 << 10

func openActivity(t *testing.T, fsys storage.FS, term uint64, slots int) *ActivityLog {
	t.Helper()
	l, err := OpenActivityLog(fsys, ActivityPath("uid", "root"), term, testExtent, slots)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func activeOnDisk(t *testing.T, fsys storage.FS) Activity {
	t.Helper()
	a, err := ReadActivity(fsys, ActivityPath("uid", "root"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(a.Extents)
	return a
}

func noFlush() error { return nil }

// change runs one change of [off, off+length) through l, ending ok.
func change(t *testing.T, l *ActivityLog, off, length int64, ok bool) {
	t.Helper()
	held, err := l.Begin(off, length, noFlush)
	if err != nil || !held {
		t.Fatalf("Begin(%d, %d): held %v, %v", off, length, held, err)
	}
	l.End(off, length, ok)
}

// TestActivityHotExtentIsFree: a change to an extent already active writes
// nothing, syncs nothing and allocates nothing; a change to a new extent
// costs one sync.
func TestActivityHotExtentIsFree(t *testing.T) {
	fsys := faultio.New(openFS(t))
	l := openActivity(t, fsys, 1, 8)
	change(t, l, 0, 4096, true)
	syncs := fsys.Syncs()
	allocs := testing.AllocsPerRun(1000, func() {
		held, err := l.Begin(4096, 8192, noFlush)
		if err != nil || !held {
			t.Fatal(held, err)
		}
		l.End(4096, 8192, true)
	})
	if allocs != 0 || fsys.Syncs() != syncs {
		t.Fatalf("a change to an active extent: %.1f allocations, %d syncs; want none", allocs, fsys.Syncs()-syncs)
	}
	change(t, l, testExtent, 1, true)
	if n := fsys.Syncs() - syncs; n != 1 {
		t.Fatalf("a change to a new extent: %d syncs, want 1", n)
	}
	if got := activeOnDisk(t, fsys).Extents; !slices.Equal(got, []int64{0, 1}) {
		t.Fatalf("on disk: %v, want [0 1]", got)
	}
}

// TestActivityRetiresOnlyWhatIsSafe: with every slot taken, a new extent
// retires the least recently used extent that has no change in flight, no
// failed change, and is covered by a completed flush; it flushes the disk
// itself when the only candidates are not flushed yet, waits when every
// candidate has a change in flight, and gives up (untrusted) when every
// slot is pinned.
func TestActivityRetiresOnlyWhatIsSafe(t *testing.T) {
	fsys := openFS(t)
	l := openActivity(t, fsys, 1, 4)
	ext := func(e int64) int64 { return e * testExtent }
	// 0: in flight; 1: failed (pinned); 2 and 3: done, not flushed.
	if held, err := l.Begin(ext(0), 10, noFlush); err != nil || !held {
		t.Fatal(held, err)
	}
	change(t, l, ext(1), 10, false)
	change(t, l, ext(2), 10, true)
	change(t, l, ext(3), 10, true)
	flushes := 0
	flush := func() error { flushes++; return nil }
	if _, err := l.Begin(ext(4), 10, flush); err != nil {
		t.Fatal(err)
	}
	l.End(ext(4), 10, true)
	if flushes != 1 {
		t.Fatalf("retiring an unflushed extent: %d flushes, want 1", flushes)
	}
	if got := activeOnDisk(t, fsys).Extents; !slices.Equal(got, []int64{0, 1, 3, 4}) {
		t.Fatalf("on disk: %v, want [0 1 3 4] (2, the least recently used safe one, retired)", got)
	}
	// 3 again: 3 and 4 are not covered by a flush. A failed flush retires
	// nothing, and fails the change.
	change(t, l, ext(3), 10, true)
	ferr := errors.New("test: flush failed")
	if _, err := l.Begin(ext(5), 10, func() error { return ferr }); !errors.Is(err, ferr) {
		t.Fatalf("Begin whose flush failed: %v", err)
	}
	// A flush of the Set covers them: 4, the least recently used, goes.
	l.Flushed(l.FlushBegin())
	change(t, l, ext(5), 10, true)
	if got := activeOnDisk(t, fsys).Extents; !slices.Equal(got, []int64{0, 1, 3, 5}) {
		t.Fatalf("on disk: %v, want [0 1 3 5]", got)
	}
	// 3 and 5 in flight too: a new extent waits for one to end.
	for _, e := range []int64{3, 5} {
		if _, err := l.Begin(ext(e), 10, noFlush); err != nil {
			t.Fatal(err)
		}
	}
	got := make(chan error)
	go func() {
		_, err := l.Begin(ext(6), 10, noFlush)
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("Begin with every extent in flight or pinned returned at once: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	l.End(ext(5), 10, true)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if got := activeOnDisk(t, fsys).Extents; !slices.Equal(got, []int64{0, 1, 3, 6}) {
		t.Fatalf("on disk: %v, want [0 1 3 6]", got)
	}
	l.End(ext(6), 10, true)
	// Every slot pinned: the log gives up for its term, durably.
	l.End(ext(0), 10, false)
	l.End(ext(3), 10, false)
	change(t, l, ext(6), 10, false)
	if held, err := l.Begin(ext(7), 10, noFlush); err != nil || held {
		t.Fatalf("Begin with every slot pinned: held %v, %v; want not held, no error", held, err)
	}
	if a := activeOnDisk(t, fsys); !a.Untrusted {
		t.Fatalf("log with every slot pinned: %+v, want untrusted", a)
	}
}

// TestActivityReopen: at the same term (a restart) the extents found stay,
// pinned; at a later term (a promotion) the log starts empty; a log of a
// later term than the opener's is refused; a damaged log at its own term is
// untrusted.
func TestActivityReopen(t *testing.T) {
	fsys := openFS(t)
	rel := ActivityPath("uid", "root")
	l, err := OpenActivityLog(fsys, rel, 3, testExtent, 2)
	if err != nil {
		t.Fatal(err)
	}
	change(t, l, 0, 10, true)
	l.Flushed(l.FlushBegin())
	_ = l.Close()

	l, err = OpenActivityLog(fsys, rel, 3, testExtent, 2)
	if err != nil {
		t.Fatal(err)
	}
	change(t, l, testExtent, 10, true)
	l.Flushed(l.FlushBegin())
	change(t, l, 2*testExtent, 10, true)
	if a := activeOnDisk(t, fsys); !slices.Equal(a.Extents, []int64{0, 2}) || a.Untrusted || a.Term != 3 {
		t.Fatalf("after a restart at the same term: %+v, want extents [0 2] (0 pinned, 1 retired)", a)
	}
	_ = l.Close()

	if _, err := OpenActivityLog(fsys, rel, 2, testExtent, 2); !errors.Is(err, ErrActivityLog) {
		t.Fatalf("opened at an earlier term than its file's: %v, want ErrActivityLog", err)
	}
	l, err = OpenActivityLog(fsys, rel, 4, testExtent, 2)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Close()
	if a := activeOnDisk(t, fsys); len(a.Extents) != 0 || a.Untrusted || a.Term != 4 {
		t.Fatalf("at a later term: %+v, want empty and trusted at term 4", a)
	}

	f, err := fsys.OpenRegular(rel, 2 /* O_RDWR */)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("garbage!"), 0); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	if _, err := ReadActivity(fsys, rel); !errors.Is(err, ErrActivityLog) {
		t.Fatalf("reading a damaged log: %v, want ErrActivityLog", err)
	}
	l, err = OpenActivityLog(fsys, rel, 4, testExtent, 2)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Close()
	if a := activeOnDisk(t, fsys); !a.Untrusted {
		t.Fatalf("a damaged log reopened at its term: %+v, want untrusted", a)
	}
}

// TestActivityPowerCut: a power cut at any sync point of a workload
// (crashfs: what was not synced is lost) leaves in the log every extent
// that a Begin returned for and that is not safe to forget: a change still
// in flight, one that failed, or one no completed flush covers.
func TestActivityPowerCut(t *testing.T) {
	const slots, extents = 6, 12
	run := func(fsys *crashfs.FS, seed uint64) (unsafe map[int64]bool) {
		rel := ActivityPath("uid", "root")
		l, err := OpenActivityLog(fsys, rel, 1, testExtent, slots)
		if err != nil {
			return nil
		}
		r := rand.New(rand.NewPCG(seed, seed))
		type state struct {
			inflight int
			failed   bool
			lastDone int
		}
		st := map[int64]*state{}
		done, flushed := 0, 0
		unsafe = map[int64]bool{}
		snapshot := func() {
			clear(unsafe)
			for e, s := range st {
				if s.inflight > 0 || s.failed || s.lastDone > flushed {
					unsafe[e] = true
				}
			}
		}
		var open [][2]int64
		flush := func() error {
			gen := done
			if fsys.Off() {
				return errors.New("power cut")
			}
			flushed = max(flushed, gen)
			return nil
		}
		for range 200 {
			op := r.IntN(4)
			failed := 0
			for _, s := range st {
				if s.failed {
					failed++
				}
			}
			if op < 2 && len(open) > 0 && len(open)+failed >= slots-1 {
				op = 2 // one goroutine: a Begin must not wait for itself
			}
			switch op {
			case 0, 1:
				e := r.Int64N(extents)
				held, err := l.Begin(e*testExtent, 100, flush)
				if err != nil {
					return unsafe
				}
				if held {
					// The caller applies the change from here on.
					if st[e] == nil {
						st[e] = &state{}
					}
					st[e].inflight++
					open = append(open, [2]int64{e, 0})
				}
			case 2:
				if len(open) == 0 {
					continue
				}
				i := r.IntN(len(open))
				e := open[i][0]
				open = slices.Delete(open, i, i+1)
				ok := r.IntN(10) > 0
				done++
				st[e].inflight--
				st[e].lastDone = done
				st[e].failed = st[e].failed || !ok
				l.End(e*testExtent, 100, ok)
			case 3:
				gen := l.FlushBegin()
				g := done
				l.Flushed(gen)
				flushed = max(flushed, g)
			}
			snapshot()
			if fsys.Off() {
				return unsafe
			}
		}
		return unsafe
	}
	// The number of sync points of a run without a cut.
	probe := crashfs.New("probe")
	run(probe, 1)
	total := len(probe.Syncs())
	if total < 10 {
		t.Fatalf("the workload made %d sync points: too few to test", total)
	}
	for seed := uint64(1); seed <= 3; seed++ {
		for k := 1; k <= total+1; k++ {
			for _, after := range []bool{false, true} {
				t.Run(fmt.Sprintf("seed %d sync %d after %v", seed, k, after), func(t *testing.T) {
					fsys := crashfs.New("cut")
					fsys.CutAtSync(k, after)
					unsafe := run(fsys, seed)
					fsys.CutPower()
					fsys.Reboot()
					a, err := ReadActivity(fsys, ActivityPath("uid", "root"))
					if errors.Is(err, fs.ErrNotExist) && len(unsafe) == 0 {
						return
					}
					if err != nil {
						t.Fatal(err)
					}
					if a.Untrusted {
						return
					}
					for e := range unsafe {
						if !slices.Contains(a.Extents, e) {
							t.Fatalf("extent %d not safe to forget, missing after the cut: log %v", e, a.Extents)
						}
					}
				})
			}
		}
	}
}
