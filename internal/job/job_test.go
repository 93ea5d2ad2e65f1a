package job

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestJobLifecycle(t *testing.T) {
	m := NewManager()
	t.Cleanup(func() { _ = m.Shutdown(context.Background()) })
	tests := []struct {
		name  string
		fn    func(ctx context.Context, j *Job) error
		state string
	}{
		{"succeeds", func(ctx context.Context, j *Job) error {
			j.AddTotal(100)
			j.Add(60)
			j.Add(40)
			j.Done("a")
			return nil
		}, Succeeded},
		{"fails", func(ctx context.Context, j *Job) error { return errors.New("boom") }, Failed},
		{"cancelled", func(ctx context.Context, j *Job) error {
			m.Cancel(j.ID())
			<-ctx.Done()
			return ctx.Err()
		}, Cancelled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := m.Start("test", tt.name, 1, tt.fn)
			_ = j.Wait(context.Background())
			st := j.Status()
			if st.State != tt.state {
				t.Fatalf("state %s, want %s (err %v)", st.State, tt.state, st.Err)
			}
			if tt.state == Succeeded && (st.BytesDone != 100 || st.BytesTotal != 100 || st.ItemsDone != 1 || st.Result[0] != "a") {
				t.Fatalf("progress not recorded: %+v", st)
			}
			if got, err := m.Get(j.ID()); err != nil || got != j {
				t.Fatalf("Get: %v", err)
			}
		})
	}
	if _, err := m.Get("nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get unknown: %v", err)
	}
}

func TestFinishedJobsExpire(t *testing.T) {
	m := NewManager()
	now := time.Now()
	m.now = func() time.Time { return now }
	j := m.Start("test", "x", 0, func(context.Context, *Job) error { return nil })
	_ = j.Wait(context.Background())
	if len(m.List()) != 1 {
		t.Fatal("finished job should be listed")
	}
	now = now.Add(Retention + time.Second)
	if len(m.List()) != 0 {
		t.Fatal("expired job still listed")
	}
}
