package job

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// memJournal is a Journal in memory.
type memJournal struct {
	mu    sync.Mutex
	data  []byte
	saves int
	fail  error
}

func (j *memJournal) Load() ([]byte, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]byte(nil), j.data...), nil
}

func (j *memJournal) Save(data []byte) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.fail != nil {
		return j.fail
	}
	j.data, j.saves = append([]byte(nil), data...), j.saves+1
	return nil
}

// TestJournalSurvivesRestart: after a restart, ended jobs are listed as
// they ended and a job that was running is listed as interrupted, with an
// error that says what happened; none of them can run again.
func TestJournalSurvivesRestart(t *testing.T) {
	jr := &memJournal{}
	m := NewManagerWithJournal(jr, func(err error) { t.Errorf("journal: %v", err) })
	ok := m.Start("snapshot", "web01@a", 0, func(context.Context, *Job) error { return nil })
	bad := m.Start("clone", "golden@v1 -> x", 2, func(_ context.Context, j *Job) error {
		j.Done("x-1")
		return errors.New("no space left in pool")
	})
	ok.Wait(context.Background())
	bad.Wait(context.Background())
	started := make(chan struct{})
	running := m.Start("rollback", "web01 -> a", 0, func(ctx context.Context, j *Job) error {
		j.AddTotal(100)
		j.Add(40)
		close(started)
		<-ctx.Done()
		return ctx.Err()
	})
	<-started
	// The server dies: the journal holds what the last save wrote, with
	// the rollback running.
	crash, _ := jr.Load()
	m.Shutdown(context.Background())

	m2 := NewManagerWithJournal(&memJournal{data: crash}, func(err error) { t.Errorf("journal: %v", err) })
	byID := map[string]Status{}
	for _, s := range m2.List() {
		byID[s.ID] = s
	}
	if s := byID[ok.ID()]; s.State != Succeeded || s.Err != nil {
		t.Errorf("succeeded job after restart: %+v", s)
	}
	if s := byID[bad.ID()]; s.State != Failed || s.Err == nil || s.Err.Error() != "no space left in pool" ||
		len(s.Result) != 1 || s.ItemsDone != 1 {
		t.Errorf("failed job after restart: %+v", s)
	}
	s := byID[running.ID()]
	if s.State != Interrupted || !errors.Is(s.Err, ErrInterrupted) || s.EndedAt.IsZero() {
		t.Errorf("running job after restart: %+v, want interrupted", s)
	}
	j, err := m2.Get(running.ID())
	if err != nil {
		t.Fatal(err)
	}
	if err := j.Wait(context.Background()); !errors.Is(err, ErrInterrupted) {
		t.Errorf("Wait on an interrupted job = %v", err)
	}
	if _, err := m2.Cancel(running.ID()); err != nil {
		t.Errorf("cancel of an interrupted job: %v", err)
	}
	m2.Shutdown(context.Background())
}

func TestJournalDamagedOrFailing(t *testing.T) {
	var reported []string
	m := NewManagerWithJournal(&memJournal{data: []byte("{not json")}, func(err error) { reported = append(reported, err.Error()) })
	if len(m.List()) != 0 || len(reported) != 1 || !strings.Contains(reported[0], "starting without it") {
		t.Fatalf("damaged journal: jobs %v, reported %q", m.List(), reported)
	}
	jr := &memJournal{fail: errors.New("read-only file system")}
	reported = nil
	m = NewManagerWithJournal(jr, func(err error) { reported = append(reported, err.Error()) })
	j := m.Start("snapshot", "v@s", 0, func(context.Context, *Job) error { return nil })
	if err := j.Wait(context.Background()); err != nil {
		t.Fatalf("a failing journal failed the job: %v", err)
	}
	m.Shutdown(context.Background())
	if len(reported) == 0 || !strings.Contains(reported[0], "read-only file system") {
		t.Fatalf("failed saves were not reported: %q", reported)
	}
}

// slowJournal is a memJournal whose writes take a while, as an fsync does.
type slowJournal struct {
	memJournal
	delay time.Duration
}

func (j *slowJournal) Save(data []byte) error {
	time.Sleep(j.delay)
	return j.memJournal.Save(data)
}

// TestJournalGroupCommit: jobs that start and end at once share journal
// writes instead of queueing one write each behind a lock, and every job
// is still journaled in its final state when its Wait returns.
func TestJournalGroupCommit(t *testing.T) {
	jr := &slowJournal{delay: 20 * time.Millisecond}
	m := NewManagerWithJournal(jr, func(err error) { t.Errorf("journal: %v", err) })
	defer m.Shutdown(context.Background())
	const n = 40
	var wg sync.WaitGroup
	ids := make(chan string, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			j := m.Start("snapshot", fmt.Sprintf("vm%d@nightly", i), 0, func(context.Context, *Job) error { return nil })
			if err := j.Wait(context.Background()); err != nil {
				t.Error(err)
			}
			// The journal already says so when Wait returns.
			data, _ := jr.Load()
			var f journalFile
			if err := json.Unmarshal(data, &f); err != nil {
				t.Error(err)
				return
			}
			found := false
			for _, r := range f.Jobs {
				found = found || (r.ID == j.ID() && r.State == Succeeded)
			}
			if !found {
				t.Errorf("job %s has ended but the journal does not say so", j.ID())
			}
			ids <- j.ID()
		}()
	}
	wg.Wait()
	close(ids)
	jr.mu.Lock()
	saves := jr.saves
	jr.mu.Unlock()
	// One write per start and one per end would be 2n, one after the other.
	if saves >= n {
		t.Fatalf("%d journal writes for %d jobs: saves are not shared", saves, n)
	}
	t.Logf("%d jobs started and ended with %d journal writes", n, saves)
}
