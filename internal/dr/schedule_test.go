package dr

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quiverstorage/quiver/internal/pool"
)

// TestSchedulerHoldsTheRPO: a volume's DR policy runs as cycles when the
// target's last point is half the RPO old (at once without one), not
// before; a target that cannot be reached makes the lag grow past the RPO
// (the metric says so) and harms nothing; once it is back, the next cycle
// brings the target to the source's newest point. A sync by hand of
// another relationship than the policy's is refused.
func TestSchedulerHoldsTheRPO(t *testing.T) {
	ctx := context.Background()
	p := openPool(t, t.TempDir())
	src := volume(t, p, vm("vm"))
	dst := volume(t, openPool(t, t.TempDir()), pool.VolumeSpec{Name: "vm-dr", Capacity: mib})
	r, err := NewReceiver(dst, "db", 3)
	if err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	s := NewScheduler(p, func(site, rel string) (Target, error) {
		if site != "b" || rel != "db" {
			return nil, ErrNoSite
		}
		if down.Load() {
			return &failing{Target: r}, nil
		}
		return r, nil
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	// age makes the relationship's record d older, as if d had passed.
	age := func(d time.Duration) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, st := range s.book {
			st.LastPointAt = st.LastPointAt.Add(-d)
			st.LastAttempt = st.LastAttempt.Add(-d)
			st.since = st.since.Add(-d)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(s)
	gauge := func(name string) float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatalf("no metric %s", name)
		return 0
	}
	tick := func() Status {
		t.Helper()
		s.RunDue(ctx)
		s.wg.Wait()
		sts := s.Statuses()
		if len(sts) != 1 {
			t.Fatalf("statuses %+v, want the one policy's", sts)
		}
		return sts[0]
	}
	rng := rand.New(rand.NewPCG(5, 6))
	scribble(t, src, rng, 50)
	s.RunDue(ctx)
	s.wg.Wait()
	if sts := s.Statuses(); len(sts) != 0 || len(points("db", src.Snapshots())) != 0 {
		t.Fatalf("a relationship without a policy: %+v", sts)
	}
	const rpo = 20 * time.Second
	if _, err := src.SetDRPolicy(ctx, &pool.DRPolicy{Site: "b", Relationship: "db", RPO: rpo}); err != nil {
		t.Fatal(err)
	}
	st := tick()
	last, ok, _ := r.Last(ctx)
	if st.Cycles != 1 || st.LastError != "" || !ok || st.LastPoint != last.Snapshot || st.Lag(time.Now()) > rpo/2 {
		t.Fatalf("after the policy was set: %+v (the target's last point %v)", st, last)
	}
	if st := tick(); st.Cycles != 1 {
		t.Fatalf("a cycle %v after the last point, with an RPO of %v: %+v", st.Lag(time.Now()), rpo, st)
	}
	scribble(t, src, rng, 5)
	age(rpo/2 + time.Second)
	if st := tick(); st.Cycles != 2 || st.LastSent == 0 || st.LastSent > 5*192<<10 {
		t.Fatalf("half the RPO later: %+v, want a second cycle of a small delta", st)
	}
	if gauge("quiver_dr_rpo_missed") != 0 || gauge("quiver_dr_lag_seconds") > (rpo/2).Seconds() {
		t.Fatal("the metrics say the RPO is missed while it holds")
	}

	// The target unreachable: cycles fail, the lag grows past the RPO.
	before, _, _ := r.Last(ctx)
	down.Store(true)
	scribble(t, src, rng, 5)
	age(rpo + time.Second)
	st = tick()
	if st.Failures != 1 || st.LastError == "" || !st.Missed(time.Now()) || gauge("quiver_dr_rpo_missed") != 1 {
		t.Fatalf("with the target unreachable: %+v", st)
	}
	if last, _, _ := r.Last(ctx); last != before {
		t.Fatalf("a failed cycle moved the target's last point from %v to %v", before, last)
	}
	if st := tick(); st.Failures != 1 {
		t.Fatalf("a retry before a tenth of the RPO: %+v", st)
	}
	// Back: the next try, a tenth of the RPO later, catches up.
	down.Store(false)
	age(rpo/10 + time.Second)
	st = tick()
	if st.Cycles != 3 || st.LastError != "" || st.Missed(time.Now()) || gauge("quiver_dr_rpo_missed") != 0 {
		t.Fatalf("with the target back: %+v", st)
	}
	last, _, _ = r.Last(ctx)
	sameContent(t, "the point after the outage", content(t, dst, last.Snapshot), content(t, src, last.Snapshot))

	if _, err := s.Sync(ctx, "vm", "b", "other", false); !errors.Is(err, pool.ErrInvalid) {
		t.Fatalf("a sync of another relationship than the policy's: %v, want ErrInvalid", err)
	}
	if st, err := s.Sync(ctx, "vm", "", "", false); err != nil || st.Point.Seq != last.Seq+1 {
		t.Fatalf("a sync by hand of the policy's relationship: %+v, %v", st, err)
	}
	if st := s.Statuses()[0]; st.Cycles != 4 {
		t.Fatalf("a sync by hand is not counted: %+v", st)
	}
	if _, err := src.SetDRPolicy(ctx, nil); err != nil {
		t.Fatal(err)
	}
	s.RunDue(ctx)
	if sts := s.Statuses(); len(sts) != 0 {
		t.Fatalf("statuses after the policy was removed: %+v", sts)
	}
}
