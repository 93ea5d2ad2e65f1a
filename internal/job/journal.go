package job

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Journal keeps the job history across restarts: Save stores it (the
// caller makes that atomic), Load returns what was saved last, or nil
// when nothing was.
type Journal interface {
	Load() ([]byte, error)
	Save(data []byte) error
}

// record is a job as the journal stores it.
type record struct {
	ID         string    `json:"id"`
	Kind       string    `json:"kind"`
	Target     string    `json:"target"`
	State      string    `json:"state"`
	Error      string    `json:"error,omitempty"`
	BytesDone  int64     `json:"bytesDone"`
	BytesTotal int64     `json:"bytesTotal"`
	ItemsDone  int       `json:"itemsDone"`
	ItemsTotal int       `json:"itemsTotal"`
	Result     []string  `json:"result,omitempty"`
	StartedAt  time.Time `json:"startedAt"`
	EndedAt    time.Time `json:"endedAt,omitzero"`
}

type journalFile struct {
	Kind    string   `json:"kind"`
	Version int      `json:"version"`
	Jobs    []record `json:"jobs"`
}

const (
	journalKind    = "Jobs"
	journalVersion = 1
	maxJournalJobs = 1000
)

// NewManagerWithJournal returns a manager that saves its jobs to journal at
// each start and end, and lists the jobs saved by the last run: the ones
// that had ended, and as Interrupted the ones that were running. A journal
// that cannot be read is reported and ignored (the history is lost, never
// the server); a failed save is reported through logf.
func NewManagerWithJournal(journal Journal, logf func(err error)) *Manager {
	m := NewManager()
	m.journal, m.log = journal, logf
	data, err := journal.Load()
	if err != nil {
		m.report(fmt.Errorf("job history: %w", err))
		return m
	}
	if data == nil {
		return m
	}
	var f journalFile
	if err := json.Unmarshal(data, &f); err != nil || f.Kind != journalKind || f.Version != journalVersion {
		m.report(fmt.Errorf("job history: not a version %d job journal (%v): starting without it", journalVersion, err))
		return m
	}
	now := m.now().UTC()
	for i, r := range f.Jobs {
		if i >= maxJournalJobs || r.ID == "" {
			break
		}
		j := &Job{id: r.ID, kind: r.Kind, target: r.Target, itemsTotal: r.ItemsTotal, started: r.StartedAt,
			cancel: func() {}, done: make(chan struct{}), state: r.State, result: r.Result, ended: r.EndedAt}
		j.bytesDone.Store(r.BytesDone)
		j.bytesTotal.Store(r.BytesTotal)
		j.itemsDone.Store(int64(r.ItemsDone))
		switch {
		case r.State == Running:
			j.state, j.err, j.ended = Interrupted, ErrInterrupted, now
		case r.State == Cancelled:
			j.err = context.Canceled
		case r.Error != "":
			j.err = errors.New(r.Error)
		}
		close(j.done)
		m.jobs[j.id] = j
	}
	m.mu.Lock()
	m.gcLocked()
	m.mu.Unlock()
	m.save()
	return m
}

// save writes every job to the journal, if there is one, and returns once
// a write that read the jobs after this call began is done. Saves asked for
// while a write is under way share the next write (group commit), so many
// jobs starting and ending at once cost a few writes, not two each, and none
// waits behind a queue of writes.
func (m *Manager) save() {
	if m.journal == nil {
		return
	}
	m.saveMu.Lock()
	defer m.saveMu.Unlock()
	m.saveAsked++
	mine := m.saveAsked
	for m.saveDone < mine {
		if m.saving {
			m.saveCond.Wait()
			continue
		}
		m.saving = true
		covers := m.saveAsked // every save asked so far made its change before asking
		m.saveMu.Unlock()
		m.write()
		m.saveMu.Lock()
		m.saving, m.saveDone = false, covers
		m.saveCond.Broadcast()
	}
}

// write writes the jobs as they are now.
func (m *Manager) write() {
	list := m.List()
	f := journalFile{Kind: journalKind, Version: journalVersion, Jobs: make([]record, 0, len(list))}
	for _, s := range list {
		r := record{ID: s.ID, Kind: s.Kind, Target: s.Target, State: s.State, BytesDone: s.BytesDone,
			BytesTotal: s.BytesTotal, ItemsDone: s.ItemsDone, ItemsTotal: s.ItemsTotal, Result: s.Result,
			StartedAt: s.StartedAt, EndedAt: s.EndedAt}
		if s.Err != nil {
			r.Error = s.Err.Error()
		}
		f.Jobs = append(f.Jobs, r)
	}
	data, err := json.Marshal(f)
	if err == nil {
		err = m.journal.Save(data)
	}
	if err != nil {
		m.report(fmt.Errorf("save the job history: %w", err))
	}
}

func (m *Manager) report(err error) {
	if m.log != nil {
		m.log(err)
	}
}
