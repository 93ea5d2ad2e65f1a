package dr

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quiverstorage/quiver/internal/pool"
)

// The scheduler: a volume's DR policy (pool.DRPolicy: a site, a
// relationship and an RPO) runs as cycles, often enough that the target's
// last point is never older than the RPO while the link and both sites
// hold.
//
// The lag of a relationship is the age of the last point the target
// committed: the time since its snapshot was taken at the source. A cycle
// starts when the lag reaches half the RPO (at once without a point), so that a cycle that takes up
// to half the RPO still lands in time; a cycle that fails is tried again a
// tenth of the RPO later (at least a second). One cycle of a volume runs at
// a time, scheduled or asked for (Sync), and at most maxCycles run at once.
// The lag, the last point and what each cycle sent are kept in memory and
// exported as metrics; the last point's time survives a restart, as it is
// the source's newest point snapshot of the relationship (a cycle keeps
// only that one).

// maxCycles bounds the cycles running at once, over every volume.
const maxCycles = 4

// Status is what the scheduler knows of one volume's relationship.
type Status struct {
	Volume       string
	Site         string
	Relationship string
	RPO          time.Duration
	// LastPoint is the newest point the target committed, as far as this
	// source knows, and LastPointAt when the source took it (zero: none).
	LastPoint   string
	LastPointAt time.Time
	Running     bool
	LastAttempt time.Time
	LastError   string // of the last cycle, when it failed
	LastSent    int64  // bytes the last successful cycle wrote to the target
	LastChanged int64  // bytes its change tracking reported
	LastTook    time.Duration
	Cycles      int64 // successful cycles since the server started
	Failures    int64 // failed cycles since the server started
	SentTotal   int64 // bytes written to the target since the server started
	// since is when the policy was first seen: the lag of a relationship
	// without a point counts from it.
	since time.Time
}

// Lag is the age of the target's last point at now (since the policy was
// first seen, without one).
func (s Status) Lag(now time.Time) time.Duration {
	if s.LastPointAt.IsZero() {
		return now.Sub(s.since)
	}
	return now.Sub(s.LastPointAt)
}

// Missed reports whether the lag is beyond the RPO at now.
func (s Status) Missed(now time.Time) bool { return s.RPO > 0 && s.Lag(now) > s.RPO }

// TargetFunc returns the target of relationship rel on site.
type TargetFunc func(site, rel string) (Target, error)

// Scheduler runs the DR policies of a pool's volumes.
type Scheduler struct {
	pool    *pool.Pool
	targets TargetFunc
	log     *slog.Logger
	slots   chan struct{} // maxCycles

	mu    sync.Mutex
	book  map[string]*Status     // by volume
	locks map[string]*sync.Mutex // by volume: one cycle at a time
	wg    sync.WaitGroup         // scheduled cycles running
}

// NewScheduler returns the scheduler of p's policies, reaching their
// sites through targets.
func NewScheduler(p *pool.Pool, targets TargetFunc, log *slog.Logger) *Scheduler {
	return &Scheduler{pool: p, targets: targets, log: log, slots: make(chan struct{}, maxCycles),
		book: map[string]*Status{}, locks: map[string]*sync.Mutex{}}
}

// Run looks for due cycles every tick until ctx ends, then waits for the
// running ones (their context ends with ctx).
func (s *Scheduler) Run(ctx context.Context, tick time.Duration) {
	t := time.NewTicker(tick)
	defer t.Stop()
	defer s.wg.Wait()
	for {
		s.RunDue(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// RunDue starts the cycles that are due now, each in its own goroutine.
func (s *Scheduler) RunDue(ctx context.Context) {
	now := time.Now()
	policies := s.pool.DRPolicies()
	for name, p := range policies {
		st := s.status(name, &p)
		s.mu.Lock()
		lag := st.Lag(now)
		retry := max(p.RPO/10, time.Second)
		due := !st.Running && (st.LastPointAt.IsZero() || lag >= p.RPO/2) && (st.LastError == "" || now.Sub(st.LastAttempt) >= retry)
		if due {
			st.Running = true // taken here, so the next tick does not start it again
		}
		s.mu.Unlock()
		if !due || ctx.Err() != nil {
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			select {
			case s.slots <- struct{}{}:
			case <-ctx.Done():
				s.mu.Lock()
				st.Running = false
				s.mu.Unlock()
				return
			}
			defer func() { <-s.slots }()
			if _, err := s.cycle(ctx, name, p, true, false); err != nil {
				s.log.Error("DR cycle failed", "volume", name, "site", p.Site, "relationship", p.Relationship, "err", err)
			}
		}()
	}
	s.forget(policies)
}

// Sync runs one cycle of the volume's relationship now (its policy's, or
// site and rel when it has none), after any cycle of the volume running;
// replace lets a full point replace the target's points (Start.Replace).
func (s *Scheduler) Sync(ctx context.Context, volume, site, rel string, replace bool) (Stats, error) {
	v, err := s.pool.Volume(volume)
	if err != nil {
		return Stats{}, err
	}
	p := pool.DRPolicy{Site: site, Relationship: rel}
	if vp := v.Info().DRPolicy; vp != nil {
		if (site != "" && site != vp.Site) || (rel != "" && rel != vp.Relationship) {
			return Stats{}, fmt.Errorf("volume %s replicates to %s/%s by its policy, not %s/%s: %w",
				volume, vp.Site, vp.Relationship, site, rel, pool.ErrInvalid)
		}
		p = *vp
	}
	return s.cycle(ctx, volume, p, false, replace)
}

// cycle runs one cycle of volume under its lock; scheduled says the
// scheduler marked it running.
func (s *Scheduler) cycle(ctx context.Context, volume string, p pool.DRPolicy, scheduled, replace bool) (Stats, error) {
	s.mu.Lock()
	l := s.locks[volume]
	if l == nil {
		l = &sync.Mutex{}
		s.locks[volume] = l
	}
	s.mu.Unlock()
	l.Lock()
	defer l.Unlock()
	st, err := s.runCycle(ctx, volume, p, replace)
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.book[volume]
	if rec == nil || rec.Site != p.Site || rec.Relationship != p.Relationship {
		if scheduled && rec != nil {
			rec.Running = false
		}
		return st, err // not the policy's relationship (a sync by hand): nothing to record
	}
	if scheduled {
		rec.Running = false
	}
	rec.LastAttempt = time.Now()
	if err != nil {
		rec.LastError = err.Error()
		rec.Failures++
		rec.SentTotal += st.Sent
		return st, err
	}
	rec.LastError = ""
	rec.LastPoint, rec.LastPointAt = st.Point.Snapshot, st.At
	rec.LastSent, rec.LastChanged, rec.LastTook = st.Sent, st.Changed, st.Duration
	rec.Cycles++
	rec.SentTotal += st.Sent
	return st, nil
}

func (s *Scheduler) runCycle(ctx context.Context, volume string, p pool.DRPolicy, replace bool) (Stats, error) {
	v, err := s.pool.Volume(volume)
	if err != nil {
		return Stats{}, err
	}
	src, err := NewSource(v, p.Relationship)
	if err != nil {
		return Stats{}, err
	}
	src.Replace = replace
	t, err := s.targets(p.Site, p.Relationship)
	if err != nil {
		return Stats{}, err
	}
	return src.Cycle(ctx, t)
}

// status returns the volume's record, made or brought in line with its
// policy p, and its last point learnt from the source's snapshots when
// not known yet.
func (s *Scheduler) status(volume string, p *pool.DRPolicy) *Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.book[volume]
	if st == nil || st.Site != p.Site || st.Relationship != p.Relationship {
		running := st != nil && st.Running
		st = &Status{Volume: volume, Site: p.Site, Relationship: p.Relationship, since: time.Now(), Running: running}
		s.book[volume] = st
	}
	st.RPO = p.RPO
	if st.LastPointAt.IsZero() {
		if v, err := s.pool.Volume(volume); err == nil {
			snaps := v.Snapshots()
			if pts := points(p.Relationship, snaps); len(pts) > 0 {
				last := pts[len(pts)-1]
				for _, sn := range snaps {
					if sn.Name == last.Snapshot {
						st.LastPoint, st.LastPointAt = last.Snapshot, sn.CreatedAt
					}
				}
			}
		}
	}
	return st
}

// forget drops the records of volumes gone or without a policy (not in
// policies).
func (s *Scheduler) forget(policies map[string]pool.DRPolicy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, st := range s.book {
		if _, ok := policies[name]; !ok && !st.Running {
			delete(s.book, name)
		}
	}
}

// Statuses lists the relationships of the pool's volumes with a policy,
// by volume name.
func (s *Scheduler) Statuses() []Status {
	policies := s.pool.DRPolicies()
	s.forget(policies)
	for name, p := range policies {
		s.status(name, &p)
	}
	s.mu.Lock()
	out := make([]Status, 0, len(s.book))
	for _, st := range s.book {
		out = append(out, *st)
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Volume < out[j].Volume })
	return out
}

// Metrics: the scheduler is a Prometheus collector of its statuses.
var (
	descLag = prometheus.NewDesc("quiver_dr_lag_seconds",
		"Age of the last point the DR target committed (since the policy was set, without one).", []string{"volume", "site", "relationship"}, nil)
	descRPO = prometheus.NewDesc("quiver_dr_rpo_seconds",
		"The relationship's recovery point objective, by its policy.", []string{"volume", "site", "relationship"}, nil)
	descMissed = prometheus.NewDesc("quiver_dr_rpo_missed",
		"1 when the lag is beyond the RPO.", []string{"volume", "site", "relationship"}, nil)
	descLastPoint = prometheus.NewDesc("quiver_dr_last_point_timestamp_seconds",
		"When the source took the last point the target committed.", []string{"volume", "site", "relationship"}, nil)
	descCycles = prometheus.NewDesc("quiver_dr_cycles_total",
		"DR cycles since the server started, by result.", []string{"volume", "site", "relationship", "result"}, nil)
	descDRSent = prometheus.NewDesc("quiver_dr_sent_bytes_total",
		"Bytes written to the DR target since the server started.", []string{"volume", "site", "relationship"}, nil)
)

// Describe implements prometheus.Collector.
func (s *Scheduler) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLag, descRPO, descMissed, descLastPoint, descCycles, descDRSent} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *Scheduler) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for _, st := range s.Statuses() {
		l := []string{st.Volume, st.Site, st.Relationship}
		ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, st.Lag(now).Seconds(), l...)
		ch <- prometheus.MustNewConstMetric(descRPO, prometheus.GaugeValue, st.RPO.Seconds(), l...)
		missed := 0.0
		if st.Missed(now) {
			missed = 1
		}
		ch <- prometheus.MustNewConstMetric(descMissed, prometheus.GaugeValue, missed, l...)
		if !st.LastPointAt.IsZero() {
			ch <- prometheus.MustNewConstMetric(descLastPoint, prometheus.GaugeValue, float64(st.LastPointAt.UnixNano())/1e9, l...)
		}
		ch <- prometheus.MustNewConstMetric(descCycles, prometheus.CounterValue, float64(st.Cycles), append(l, "success")...)
		ch <- prometheus.MustNewConstMetric(descCycles, prometheus.CounterValue, float64(st.Failures), append(l, "failure")...)
		ch <- prometheus.MustNewConstMetric(descDRSent, prometheus.CounterValue, float64(st.SentTotal), l...)
	}
}
