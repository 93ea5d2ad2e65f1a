package crash

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/quiverstorage/quiver/internal/client"
)

// flight is what the workers are doing, for the killer.
type flight struct {
	mu      sync.Mutex
	stopped bool     // no operation may start any more
	kind    []string // per worker: the kind of the operation in flight, or ""
	since   []time.Time
}

// begin marks an operation of worker i in flight, or reports false once the
// workload is stopped.
func (f *flight) begin(i int, kind string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return false
	}
	f.kind[i], f.since[i] = kind, time.Now()
	return true
}

func (f *flight) end(i int) {
	f.mu.Lock()
	f.kind[i] = ""
	f.mu.Unlock()
}

// started returns when an operation of kind began in flight, if one is.
func (f *flight) started(kind string) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, k := range f.kind {
		if k == kind {
			return f.since[i], true
		}
	}
	return time.Time{}, false
}

// workload runs the workers against the server and SIGKILLs it, after a
// random delay or aimed at an operation. It records the operation each
// worker had in flight.
func (h *harness) workload(ctx context.Context, n int) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	f := &flight{kind: make([]string, workers), since: make([]time.Time, workers)}
	failures := make([]error, workers)
	var wg sync.WaitGroup
	for i, w := range h.workers {
		first := h.retry[i]
		if first != nil && h.rng.IntN(2) == 0 {
			first = nil
		}
		wg.Go(func() {
			for {
				o, retried := first, first != nil
				if retried {
					first = nil
				} else {
					h.mu.Lock()
					o = w.next(h.model)
					h.mu.Unlock()
				}
				if !f.begin(i, o.kind) {
					return
				}
				start := time.Now()
				err := o.call(ctx, h.srv.API)
				f.end(i)
				if retried {
					h.mu.Lock()
					h.stats.retries++
					h.mu.Unlock()
				}
				if err == nil {
					h.mu.Lock()
					h.model.apply(o.alts)
					h.stats.acked[o.kind]++
					h.stats.took[o.kind] += time.Since(start)
					h.mu.Unlock()
					continue
				}
				var wa *wrongAnswer
				if errors.As(err, &wa) || client.Code(err) != "" {
					// The server answered: no crash explains a refusal or
					// a wrong answer.
					failures[i] = fmt.Errorf("%s: %w", o.desc, err)
					return
				}
				h.uncertain[i] = o // the kill interrupted it: it may or may not have happened
				return
			}
		})
	}
	h.waitToKill(f)
	f.mu.Lock()
	f.stopped = true
	busy := 0
	for _, k := range f.kind {
		if k != "" {
			busy++
		}
	}
	h.srv.Kill()
	f.mu.Unlock()
	wg.Wait()
	if busy > 0 {
		h.stats.inflightKills++
	}
	for i, err := range failures {
		if err != nil {
			h.fatalf(n, "worker %s: %v", h.workers[i].prefix, err)
		}
	}
	for _, o := range h.uncertain {
		if o != nil {
			h.stats.uncertain[o.kind]++
		}
	}
}
