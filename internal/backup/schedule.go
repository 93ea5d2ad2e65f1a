package backup

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quiverstorage/quiver/internal/pool"
)

// Status is what the service knows of a volume's backups to a target.
type Status struct {
	Volume      string
	Target      string
	Every       time.Duration // the policy's, 0 without one
	LastSuccess time.Time     // the newest backup's time (zero: none known)
	LastBackup  string
	LastAttempt time.Time
	LastError   string // of the last attempt, when it failed
	BytesRead   int64  // of the newest backup
	BytesSent   int64
	Dedup       float64 // chunks already stored / chunks read, of the newest backup
	Failures    int64   // failed attempts in all, since start
	SentTotal   int64   // bytes sent by every backup since start
}

// Overdue reports whether the newest backup is older than the policy
// allows (one and a half times its interval), at now.
func (s Status) Overdue(now time.Time) bool {
	return s.Every > 0 && (s.LastSuccess.IsZero() || now.Sub(s.LastSuccess) > s.Every+s.Every/2)
}

type statusKey struct{ volume, target string }

type statusBook struct {
	mu     sync.Mutex
	byKey  map[statusKey]*Status
	loaded map[string]bool // targets whose repository was listed
}

func (s *Service) status(volume, target string) *Status {
	s.book.mu.Lock()
	defer s.book.mu.Unlock()
	if s.book.byKey == nil {
		s.book.byKey = map[statusKey]*Status{}
	}
	k := statusKey{volume, target}
	st := s.book.byKey[k]
	if st == nil {
		st = &Status{Volume: volume, Target: target}
		s.book.byKey[k] = st
	}
	return st
}

// recordSuccess and recordFailure keep a volume's status.
func (s *Service) recordSuccess(target string, m *Manifest) {
	st := s.status(m.Volume, target)
	s.book.mu.Lock()
	defer s.book.mu.Unlock()
	st.LastSuccess, st.LastBackup, st.LastAttempt, st.LastError = m.CreatedAt, m.ID, time.Now(), ""
	st.BytesRead, st.BytesSent = m.Stats.BytesRead, m.Stats.BytesSent
	st.SentTotal += m.Stats.BytesSent
	if n := m.Stats.ChunksNew + m.Stats.ChunksReused; n > 0 {
		st.Dedup = float64(m.Stats.ChunksReused) / float64(n)
	}
}

func (s *Service) recordFailure(volume, target string, err error) {
	st := s.status(volume, target)
	s.book.mu.Lock()
	defer s.book.mu.Unlock()
	st.LastAttempt, st.LastError = time.Now(), err.Error()
	st.Failures++
}

// learn fills the statuses of a target's volumes from its repository, once.
func (s *Service) learn(ctx context.Context, target string) {
	s.book.mu.Lock()
	if s.book.loaded == nil {
		s.book.loaded = map[string]bool{}
	}
	done := s.book.loaded[target]
	s.book.mu.Unlock()
	if done {
		return
	}
	r, err := s.Repo(ctx, target)
	if err != nil {
		return
	}
	list, _, err := r.List(ctx, "")
	if err != nil {
		return
	}
	for _, m := range list { // oldest first: the newest ends up recorded
		st := s.status(m.Volume, target)
		s.book.mu.Lock()
		newer := m.CreatedAt.After(st.LastSuccess)
		s.book.mu.Unlock()
		if newer {
			s.recordSuccess(target, m)
		}
	}
	s.book.mu.Lock()
	s.book.loaded[target] = true
	s.book.mu.Unlock()
}

// Statuses lists what the service knows of every volume with a policy or
// a backup, by volume and target.
func (s *Service) Statuses(ctx context.Context) []Status {
	for _, t := range s.order {
		s.learn(ctx, t)
	}
	for _, v := range s.pool.List(nil) {
		if p := v.BackupPolicy; p != nil {
			if t := s.policyTarget(p); t != "" {
				st := s.status(v.Name, t)
				s.book.mu.Lock()
				st.Every = p.Every
				s.book.mu.Unlock()
			}
		}
	}
	s.book.mu.Lock()
	defer s.book.mu.Unlock()
	out := make([]Status, 0, len(s.book.byKey))
	for _, st := range s.book.byKey {
		out = append(out, *st)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Volume != out[j].Volume {
			return out[i].Volume < out[j].Volume
		}
		return out[i].Target < out[j].Target
	})
	return out
}

func (s *Service) policyTarget(p *pool.BackupPolicy) string {
	if p.Target != "" {
		return p.Target
	}
	return s.Default()
}

// Run resumes the copies of instant restores a restart interrupted, then
// backs up every volume whose policy says it is due, checking every tick,
// until ctx ends. After a backup it prunes the volume's backups by
// the policy's keep rules and collects the chunks they freed.
func (s *Service) Run(ctx context.Context, tick time.Duration) {
	s.resumeFills()
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		s.RunDue(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// RunDue runs the backups that are due now, one after the other.
func (s *Service) RunDue(ctx context.Context) {
	for _, v := range s.pool.List(nil) {
		p := v.BackupPolicy
		if p == nil || v.Broken != "" || v.Replicas > 1 {
			continue
		}
		target := s.policyTarget(p)
		if target == "" {
			continue
		}
		s.learn(ctx, target)
		st := s.status(v.Name, target)
		s.book.mu.Lock()
		st.Every = p.Every
		due := st.LastSuccess.IsZero() || time.Since(st.LastSuccess) >= p.Every
		// After a failure, wait a tenth of the interval (at least a
		// minute) before trying again.
		retry := max(p.Every/10, time.Minute)
		waiting := st.LastError != "" && time.Since(st.LastAttempt) < retry
		s.book.mu.Unlock()
		if !due || waiting || ctx.Err() != nil {
			continue
		}
		m, err := s.Backup(ctx, v.Name, target, false, nil)
		if err != nil {
			s.log.Error("scheduled backup failed", "volume", v.Name, "target", target, "err", err)
			continue
		}
		s.log.Info("scheduled backup", "volume", v.Name, "target", target, "backup", m.ID,
			"read", m.Stats.BytesRead, "sent", m.Stats.BytesSent)
		keep := KeepPolicy{Last: p.KeepLast, Daily: p.KeepDaily, Weekly: p.KeepWeekly, Monthly: p.KeepMonthly}
		if keep.Zero() {
			continue
		}
		r, err := s.Repo(ctx, target)
		if err != nil {
			continue
		}
		dropped, err := r.Prune(ctx, v.Name, keep)
		if err != nil {
			s.log.Error("pruning backups", "volume", v.Name, "target", target, "err", err)
			continue
		}
		if len(dropped) > 0 {
			if n, freed, err := r.Collect(ctx); err != nil {
				s.log.Warn("collecting chunks after pruning", "target", target, "err", err)
			} else {
				s.log.Info("pruned backups", "volume", v.Name, "target", target, "backups", len(dropped), "chunks", n, "bytes", freed)
			}
		}
	}
}

// Metrics: the service is a Prometheus collector of its statuses.
var (
	descLastSuccess = prometheus.NewDesc("quiver_backup_last_success_timestamp_seconds",
		"Time of the volume's newest backup in the target.", []string{"volume", "target"}, nil)
	descInterval = prometheus.NewDesc("quiver_backup_policy_interval_seconds",
		"The volume's backup interval by its policy (0: no policy).", []string{"volume", "target"}, nil)
	descOverdue = prometheus.NewDesc("quiver_backup_overdue",
		"1 when the newest backup is older than 1.5 times the policy's interval.", []string{"volume", "target"}, nil)
	descSent = prometheus.NewDesc("quiver_backup_sent_bytes_total",
		"Bytes stored by the volume's backups since the server started (compressed, encrypted).", []string{"volume", "target"}, nil)
	descLastSent = prometheus.NewDesc("quiver_backup_last_sent_bytes",
		"Bytes the newest backup stored.", []string{"volume", "target"}, nil)
	descDedup = prometheus.NewDesc("quiver_backup_dedup_ratio",
		"Of the chunks the newest backup read, the share already in the repository.", []string{"volume", "target"}, nil)
	descFailures = prometheus.NewDesc("quiver_backup_failures_total",
		"Failed backups of the volume since the server started.", []string{"volume", "target"}, nil)
)

// Describe implements prometheus.Collector.
func (s *Service) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLastSuccess, descInterval, descOverdue, descSent, descLastSent, descDedup, descFailures} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. It reads what the service
// knows; it never reaches a store.
func (s *Service) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	s.book.mu.Lock()
	sts := make([]Status, 0, len(s.book.byKey))
	for k, st := range s.book.byKey {
		if _, err := s.pool.Volume(k.volume); err != nil {
			delete(s.book.byKey, k) // the volume is gone: so are its series
			continue
		}
		sts = append(sts, *st)
	}
	s.book.mu.Unlock()
	for _, st := range sts {
		l := []string{st.Volume, st.Target}
		if !st.LastSuccess.IsZero() {
			ch <- prometheus.MustNewConstMetric(descLastSuccess, prometheus.GaugeValue, float64(st.LastSuccess.UnixNano())/1e9, l...)
		}
		ch <- prometheus.MustNewConstMetric(descInterval, prometheus.GaugeValue, st.Every.Seconds(), l...)
		overdue := 0.0
		if st.Overdue(now) {
			overdue = 1
		}
		ch <- prometheus.MustNewConstMetric(descOverdue, prometheus.GaugeValue, overdue, l...)
		ch <- prometheus.MustNewConstMetric(descSent, prometheus.CounterValue, float64(st.SentTotal), l...)
		ch <- prometheus.MustNewConstMetric(descLastSent, prometheus.GaugeValue, float64(st.BytesSent), l...)
		ch <- prometheus.MustNewConstMetric(descDedup, prometheus.GaugeValue, st.Dedup, l...)
		ch <- prometheus.MustNewConstMetric(descFailures, prometheus.CounterValue, float64(st.Failures), l...)
	}
}
