package replica

import "sync"

// RangeLock orders overlapping changes of one disk: a change waits until
// every change in flight that overlaps it has been applied locally and on
// every copy. Changes in flight together then never overlap, so the local
// disk and each copy apply overlapping ones in the same order and cannot
// diverge, whatever order the network delivers them in. Every handle of a
// disk must share one RangeLock.
type RangeLock struct {
	mu   sync.Mutex
	cond *sync.Cond
	held map[*[2]int64]struct{}
}

// NewRangeLock returns the lock of one disk.
func NewRangeLock() *RangeLock {
	l := &RangeLock{held: map[*[2]int64]struct{}{}}
	l.cond = sync.NewCond(&l.mu)
	return l
}

func (l *RangeLock) lock(off, length int64) *[2]int64 {
	r := &[2]int64{off, off + length}
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.overlaps(r) {
		l.cond.Wait()
	}
	l.held[r] = struct{}{}
	return r
}

func (l *RangeLock) overlaps(r *[2]int64) bool {
	for h := range l.held {
		if r[0] < h[1] && h[0] < r[1] {
			return true
		}
	}
	return false
}

func (l *RangeLock) unlock(r *[2]int64) {
	l.mu.Lock()
	delete(l.held, r)
	l.mu.Unlock()
	l.cond.Broadcast()
}
