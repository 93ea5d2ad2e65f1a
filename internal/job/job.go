package job

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// States of a job.
const (
	Running   = "running"
	Succeeded = "succeeded"
	Failed    = "failed"
	Cancelled = "cancelled"
	// Interrupted is a job that was running when its server stopped; it
	// shows after the restart (Journal) as ended, never to resume.
	Interrupted = "interrupted"
)

// ErrNotFound is returned for an unknown job id.
var ErrNotFound = errors.New("job not found")

// ErrInterrupted is the error of a job that was running when its server
// stopped: what it did is undone at start-up (staging is cleared), and
// nothing of it is left.
var ErrInterrupted = errors.New("the server stopped while the job ran; its partial work was discarded: run it again")

// Retention is how long a finished job stays listed.
const Retention = 10 * time.Minute

// Job is one long operation. Its progress methods are safe for concurrent
// use by the operation's workers.
type Job struct {
	id, kind, target string
	itemsTotal       int
	started          time.Time
	cancel           context.CancelFunc
	done             chan struct{}

	bytesDone, bytesTotal, itemsDone atomic.Int64

	mu     sync.Mutex
	state  string
	err    error
	result []string
	ended  time.Time
}

// Status is a point-in-time copy of a job.
type Status struct {
	ID, Kind, Target, State string
	BytesDone, BytesTotal   int64
	ItemsDone, ItemsTotal   int
	Err                     error
	Result                  []string
	StartedAt, EndedAt      time.Time
}

// AddTotal adds to the bytes the job has to move.
func (j *Job) AddTotal(n int64) { j.bytesTotal.Add(n) }

// Add records bytes moved.
func (j *Job) Add(n int64) { j.bytesDone.Add(n) }

// Done records one finished item (a clone, a snapshot) by name.
func (j *Job) Done(item string) {
	j.itemsDone.Add(1)
	j.mu.Lock()
	j.result = append(j.result, item)
	j.mu.Unlock()
}

// ID returns the job id.
func (j *Job) ID() string { return j.id }

// Wait blocks until the job ends or ctx is done, and returns the job's error.
func (j *Job) Wait(ctx context.Context) error {
	select {
	case <-j.done:
		j.mu.Lock()
		defer j.mu.Unlock()
		return j.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Status returns a copy of the job's state.
func (j *Job) Status() Status {
	j.mu.Lock()
	defer j.mu.Unlock()
	return Status{ID: j.id, Kind: j.kind, Target: j.target, State: j.state,
		BytesDone: j.bytesDone.Load(), BytesTotal: j.bytesTotal.Load(),
		ItemsDone: int(j.itemsDone.Load()), ItemsTotal: j.itemsTotal,
		Err: j.err, Result: append([]string(nil), j.result...), StartedAt: j.started, EndedAt: j.ended}
}

// Manager owns the running and recently finished jobs.
type Manager struct {
	base    context.Context
	stop    context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	jobs    map[string]*Job
	now     func() time.Time
	retain  time.Duration
	journal Journal
	log     func(err error)

	// Group commit of the journal (save): one write covers every change
	// whose save was asked before the write read the jobs.
	saveMu    sync.Mutex
	saveCond  *sync.Cond
	saveAsked uint64 // saves asked for so far
	saveDone  uint64 // saves asked for up to this one are written
	saving    bool   // a write is in progress
}

// NewManager returns a manager whose jobs are cancelled by Shutdown.
func NewManager() *Manager {
	base, stop := context.WithCancel(context.Background())
	m := &Manager{base: base, stop: stop, jobs: map[string]*Job{}, now: time.Now, retain: Retention}
	m.saveCond = sync.NewCond(&m.saveMu)
	return m
}

// Start runs fn in the background as a new job. items is the number of
// items the job will report through Done (0 if it reports none).
func (m *Manager) Start(kind, target string, items int, fn func(ctx context.Context, j *Job) error) *Job {
	ctx, cancel := context.WithCancel(m.base)
	var b [8]byte
	_, _ = rand.Read(b[:])
	j := &Job{id: hex.EncodeToString(b[:]), kind: kind, target: target, itemsTotal: items,
		started: m.now().UTC(), cancel: cancel, done: make(chan struct{}), state: Running}
	m.mu.Lock()
	m.gcLocked()
	m.jobs[j.id] = j
	m.mu.Unlock()
	m.save()
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer cancel()
		err := fn(ctx, j)
		j.mu.Lock()
		j.err, j.ended = err, m.now().UTC()
		switch {
		case err == nil:
			j.state = Succeeded
		case errors.Is(err, context.Canceled):
			j.state = Cancelled
		default:
			j.state = Failed
		}
		j.mu.Unlock()
		m.save() // before Wait returns: an ended job is never journaled as running
		close(j.done)
	}()
	return j
}

// Get returns a job by id.
func (m *Manager) Get(id string) (*Job, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	j, ok := m.jobs[id]
	if !ok {
		return nil, ErrNotFound
	}
	return j, nil
}

// List returns every job, newest first.
func (m *Manager) List() []Status {
	m.mu.Lock()
	m.gcLocked()
	jobs := make([]*Job, 0, len(m.jobs))
	for _, j := range m.jobs {
		jobs = append(jobs, j)
	}
	m.mu.Unlock()
	out := make([]Status, 0, len(jobs))
	for _, j := range jobs {
		out = append(out, j.Status())
	}
	sort.Slice(out, func(a, b int) bool { return out[a].StartedAt.After(out[b].StartedAt) })
	return out
}

// Cancel asks a running job to stop; it ends as Cancelled once the
// operation has undone its partial work.
func (m *Manager) Cancel(id string) (*Job, error) {
	j, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	j.cancel()
	return j, nil
}

// Shutdown cancels every running job and waits for them to end or for ctx.
func (m *Manager) Shutdown(ctx context.Context) error {
	m.stop()
	done := make(chan struct{})
	go func() { m.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *Manager) gcLocked() {
	cutoff := m.now().Add(-m.retain)
	for id, j := range m.jobs {
		j.mu.Lock()
		old := j.state != Running && j.ended.Before(cutoff)
		j.mu.Unlock()
		if old {
			delete(m.jobs, id)
		}
	}
}
