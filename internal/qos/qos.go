package qos

import (
	"context"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Limits of one volume. Zero means unlimited. MBytes are 10^6 bytes per
// second, as in the CSI parameter qos_rw_mbytes.
type Limits struct {
	RWIOPS      int64 `json:"rwIOPS,omitempty"`
	RWMBytes    int64 `json:"rwMBytes,omitempty"`
	ReadIOPS    int64 `json:"readIOPS,omitempty"`
	WriteIOPS   int64 `json:"writeIOPS,omitempty"`
	ReadMBytes  int64 `json:"readMBytes,omitempty"`
	WriteMBytes int64 `json:"writeMBytes,omitempty"`
}

// MaxLimit bounds each limit (10 M IOPS, 10 TB/s): anything larger is a typo.
const MaxLimit = 10_000_000

// Validate checks every limit is in [0, MaxLimit].
func (l Limits) Validate() error {
	for _, f := range []struct {
		name string
		v    int64
	}{{"rwIOPS", l.RWIOPS}, {"rwMBytes", l.RWMBytes}, {"readIOPS", l.ReadIOPS}, {"writeIOPS", l.WriteIOPS},
		{"readMBytes", l.ReadMBytes}, {"writeMBytes", l.WriteMBytes}} {
		if f.v < 0 || f.v > MaxLimit {
			return fmt.Errorf("qos.%s %d: must be between 0 (unlimited) and %d", f.name, f.v, MaxLimit)
		}
	}
	return nil
}

// Unlimited reports whether no limit is set.
func (l Limits) Unlimited() bool { return l == Limits{} }

// Burst is how much work may run ahead of the rate: the tokens of this
// window, at least one operation or 256 KiB. It keeps short bursts smooth
// without letting a volume exceed its limit by much over any second.
const Burst = 100 * time.Millisecond

// Op is the kind of request being admitted.
type Op int

// Request kinds. Trim and zero are writes of no bandwidth.
const (
	Read Op = iota
	Write
)

// Limiter admits the requests of one volume. It is safe for concurrent use.
type Limiter struct {
	unlimited atomic.Bool
	mu        sync.Mutex
	limits    Limits
	// Token buckets: operations and bytes for rw, read and write.
	rwOps, rOps, wOps, rwBytes, rBytes, wBytes *rate.Limiter
}

// New returns a limiter with limits.
func New(l Limits) *Limiter {
	q := &Limiter{}
	for _, p := range []**rate.Limiter{&q.rwOps, &q.rOps, &q.wOps, &q.rwBytes, &q.rBytes, &q.wBytes} {
		*p = rate.NewLimiter(rate.Inf, 1)
	}
	q.Set(l)
	return q
}

// Set changes the limits live: requests already waiting are admitted at the
// new rate.
func (q *Limiter) Set(l Limits) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.limits = l
	now := time.Now()
	setOps(q.rwOps, l.RWIOPS, now)
	setOps(q.rOps, l.ReadIOPS, now)
	setOps(q.wOps, l.WriteIOPS, now)
	setBytes(q.rwBytes, l.RWMBytes, now)
	setBytes(q.rBytes, l.ReadMBytes, now)
	setBytes(q.wBytes, l.WriteMBytes, now)
	q.unlimited.Store(l.Unlimited())
}

func setOps(r *rate.Limiter, iops int64, now time.Time) {
	if iops == 0 {
		r.SetLimitAt(now, rate.Inf)
		return
	}
	r.SetLimitAt(now, rate.Limit(iops))
	r.SetBurstAt(now, int(max(1, float64(iops)*Burst.Seconds())))
}

func setBytes(r *rate.Limiter, mbytes int64, now time.Time) {
	if mbytes == 0 {
		r.SetLimitAt(now, rate.Inf)
		return
	}
	bps := float64(mbytes) * 1e6
	r.SetLimitAt(now, rate.Limit(bps))
	r.SetBurstAt(now, int(max(256<<10, bps*Burst.Seconds())))
}

// Unlimited reports whether the limiter has no limits at the moment, so
// that every request is admitted at once.
func (q *Limiter) Unlimited() bool { return q == nil || q.unlimited.Load() }

// Limits returns the current limits.
func (q *Limiter) Limits() Limits {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.limits
}

// Wait admits one request of op moving bytes, waiting for tokens as needed,
// and returns how long it waited. A request larger than the burst is
// admitted and paid for: it waits as long as its size takes at the rate, so
// nothing starves and nothing exceeds the limit. With no limits it returns at
// once without locking.
func (q *Limiter) Wait(ctx context.Context, op Op, bytes int64) (time.Duration, error) {
	if q == nil || q.unlimited.Load() {
		return 0, nil
	}
	start := time.Now()
	ops, byteLims := q.buckets(op)
	for _, r := range ops {
		if err := waitN(ctx, r, 1); err != nil {
			return time.Since(start), err
		}
	}
	if bytes > 0 {
		for _, r := range byteLims {
			if err := waitN(ctx, r, bytes); err != nil {
				return time.Since(start), err
			}
		}
	}
	return time.Since(start), nil
}

func (q *Limiter) buckets(op Op) ([2]*rate.Limiter, [2]*rate.Limiter) {
	if op == Read {
		return [2]*rate.Limiter{q.rwOps, q.rOps}, [2]*rate.Limiter{q.rwBytes, q.rBytes}
	}
	return [2]*rate.Limiter{q.rwOps, q.wOps}, [2]*rate.Limiter{q.rwBytes, q.wBytes}
}

// waitN takes n tokens, in burst-sized steps when n exceeds the burst. A
// live Set may shrink the burst between reading it and waiting; the step is
// then recomputed, so a request never fails because its limits changed.
func waitN(ctx context.Context, r *rate.Limiter, n int64) error {
	for n > 0 {
		if r.Limit() == rate.Inf {
			return nil
		}
		step := min(n, int64(max(1, r.Burst())), math.MaxInt32)
		if err := r.WaitN(ctx, int(step)); err != nil {
			if ctx.Err() != nil {
				return err
			}
			continue // the burst shrank under us: recompute the step
		}
		n -= step
	}
	return nil
}
