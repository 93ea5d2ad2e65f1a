package pool

import (
	"errors"
	"maps"
	"slices"
)

// writerRules is the attachment and single-writer rule of one volume as a
// pure state machine: a value that each event (attach, detach, claim,
// transfer) turns into a new value and a ruleChange saying what the caller
// must do. It does no I/O, takes no lock and reads no clock; the Volume
// persists a change (attachments.json) before it publishes the new value,
// and publishes it under its locks (attach.go).
//
// A value is never modified once made: every event copies members, so a
// published value may be read without a lock (the write check does, under
// the gate held shared).
//
// The rules:
//   - Each attachment gets a sequence number, growing with creation order.
//   - The writer is a group: an explicit attachment's ID, or ImplicitWriter
//     for every tokenless (implicit) attachment together.
//   - A claim (the first write of an attachment outside the writer group)
//     by an attachment newer than the writer's claim takes the role: the
//     epoch grows by one and every rw attachment of another group older
//     than the claimer is fenced. An older claimer is fenced instead.
//   - A transfer gives the role to a chosen rw attachment, unfencing it:
//     the epoch grows by one and every rw attachment of another group is
//     fenced.
//   - Fenced attachments stay fenced, except the target of a transfer.
//   - ro attachments never write, never claim and are never fenced.
//   - While an explicit rw attachment exists, implicit ones are read-only:
//     one attached then is ro, one attached before may not write.
//   - Detaching removes an attachment from every set; the writer and epoch
//     stay (a later claimer must still be newer than the writer's claim).
//   - Only explicit attachments are persisted; implicit ones end with their
//     connection, so a change to them alone needs no write.
type writerRules struct {
	epoch     uint64
	writer    string // a group: an attachment ID, ImplicitWriter, or "" before any write
	writerSeq uint64 // the sequence number of the writer's claim
	nextSeq   uint64
	// explicitRW counts the explicit rw members.
	explicitRW int
	members    map[string]ruleMember
}

// ruleMember is one attachment as the rule sees it.
type ruleMember struct {
	seq      uint64
	mode     string
	implicit bool
	fenced   bool
}

func (m ruleMember) group(id string) string {
	if m.implicit {
		return ImplicitWriter
	}
	return id
}

// ruleChange is what an event asks of the caller, besides publishing the
// new value.
type ruleChange struct {
	// persist: write the new value to attachments.json, durably, before
	// publishing it; if the write fails, keep the old value.
	persist bool
	// fenced lists the attachments this event fenced, sorted.
	fenced []string
	// writerMoved: the epoch grew (a claim or a transfer).
	writerMoved bool
}

// Errors of the rule. The Volume words them for its callers.
var (
	// errMustClaim says a write needs the writer role first.
	errMustClaim = errors.New("must claim the writer role")
	// errNotAttached: the attachment was detached (or never existed).
	errNotAttached = errors.New("not attached")
	// errTokenlessReadOnly: an implicit attachment while an explicit rw
	// attachment exists.
	errTokenlessReadOnly = errors.New("tokenless connections are read-only while an rw attachment exists")
)

func newWriterRules() writerRules {
	return writerRules{nextSeq: 1, members: map[string]ruleMember{}}
}

func (r writerRules) with(id string, m ruleMember) writerRules {
	r.members = maps.Clone(r.members)
	if r.members == nil {
		r.members = map[string]ruleMember{}
	}
	r.members[id] = m
	return r
}

func (r writerRules) member(id string) (ruleMember, bool) {
	m, ok := r.members[id]
	return m, ok
}

// readOnlyImplicit says whether m is an implicit attachment that may not
// write because an explicit rw attachment exists.
func (r writerRules) readOnlyImplicit(m ruleMember) bool { return m.implicit && r.explicitRW > 0 }

// isWriter says whether id holds the writer role.
func (r writerRules) isWriter(id string) bool {
	m, ok := r.members[id]
	return ok && m.mode == ModeReadWrite && !m.fenced && r.writer != "" && r.writer == m.group(id)
}

// attach adds attachment id with mode (rw or ro) and returns the member
// made. An implicit attachment is ro while an explicit rw one exists,
// whatever mode asks. It fails with ErrExists if id is taken.
func (r writerRules) attach(id, mode string, implicit bool) (writerRules, ruleMember, ruleChange, error) {
	if _, ok := r.members[id]; ok {
		return r, ruleMember{}, ruleChange{}, ErrExists
	}
	if mode != ModeReadOnly {
		mode = ModeReadWrite
	}
	if implicit && r.explicitRW > 0 {
		mode = ModeReadOnly
	}
	m := ruleMember{seq: r.nextSeq, mode: mode, implicit: implicit}
	next := r.with(id, m)
	next.nextSeq++
	if !implicit && mode == ModeReadWrite {
		next.explicitRW++
	}
	return next, m, ruleChange{persist: !implicit}, nil
}

// detach removes attachment id (errNotAttached if absent).
func (r writerRules) detach(id string) (writerRules, ruleChange, error) {
	m, ok := r.members[id]
	if !ok {
		return r, ruleChange{}, errNotAttached
	}
	next := r
	next.members = maps.Clone(r.members)
	delete(next.members, id)
	if !m.implicit && m.mode == ModeReadWrite {
		next.explicitRW--
	}
	return next, ruleChange{persist: !m.implicit}, nil
}

// detachAll removes every attachment, for a volume being deleted: nothing
// is persisted, the volume's directory goes with it. The writer fields
// stay.
func (r writerRules) detachAll() writerRules {
	r.members, r.explicitRW = map[string]ruleMember{}, 0
	return r
}

// admit says whether attachment id may write now: nil, errMustClaim (it
// must claim the role first), or why not (ErrReadOnly,
// errTokenlessReadOnly, errNotAttached, ErrFenced). A shared disk admits
// every rw attachment.
func (r writerRules) admit(id string, shared bool) error {
	m, ok := r.members[id]
	switch {
	case !ok:
		return errNotAttached
	case m.mode == ModeReadOnly:
		return ErrReadOnly
	case r.readOnlyImplicit(m):
		return errTokenlessReadOnly
	case shared:
		return nil
	case m.fenced:
		return ErrFenced
	case r.writer == m.group(id):
		return nil
	}
	return errMustClaim
}

// claim is attachment id's claim of the writer role, on a write that admit
// answered errMustClaim. It returns nil when id's group holds the role
// after it. An older claimer is fenced: the new value has it fenced (to
// persist) and the error is ErrFenced.
func (r writerRules) claim(id string) (writerRules, ruleChange, error) {
	m, ok := r.members[id]
	switch {
	case !ok:
		return r, ruleChange{}, errNotAttached
	case m.mode == ModeReadOnly:
		return r, ruleChange{}, ErrReadOnly
	case r.readOnlyImplicit(m):
		return r, ruleChange{}, errTokenlessReadOnly
	case m.fenced:
		return r, ruleChange{}, ErrFenced
	case r.writer == m.group(id):
		return r, ruleChange{}, nil // another member of the group claimed meanwhile
	case r.writer != "" && m.seq < r.writerSeq:
		m.fenced = true
		return r.with(id, m), ruleChange{persist: true, fenced: []string{id}}, ErrFenced
	}
	return r.moveWriter(id, m, func(o ruleMember) bool { return o.seq < m.seq })
}

// transfer gives the writer role to attachment id, unfencing it and
// fencing every rw attachment of another group (ErrAttachmentNotFound if
// absent, ErrReadOnly if it is ro).
func (r writerRules) transfer(id string) (writerRules, ruleChange, error) {
	m, ok := r.members[id]
	switch {
	case !ok:
		return r, ruleChange{}, ErrAttachmentNotFound
	case m.mode == ModeReadOnly:
		return r, ruleChange{}, ErrReadOnly
	}
	m.fenced = false
	return r.with(id, m).moveWriter(id, m, func(ruleMember) bool { return true })
}

// moveWriter makes id's group the writer with a new epoch, fencing every
// rw member of another group for which older says so.
func (r writerRules) moveWriter(id string, m ruleMember, older func(ruleMember) bool) (writerRules, ruleChange, error) {
	next := r
	next.members = maps.Clone(r.members)
	next.epoch++
	next.writer = m.group(id)
	next.writerSeq = m.seq
	ch := ruleChange{persist: true, writerMoved: true}
	for oid, o := range r.members {
		if o.group(oid) != next.writer && o.mode == ModeReadWrite && older(o) {
			if !o.fenced {
				o.fenced = true
				next.members[oid] = o
			}
			ch.fenced = append(ch.fenced, oid)
		}
	}
	slices.Sort(ch.fenced)
	return next, ch, nil
}

// ruleRecord is what attachments.json holds of an explicit attachment for
// the rule; the Volume adds the node, the token and the rest.
type ruleRecord struct {
	ID     string
	Mode   string
	Seq    uint64
	Fenced bool
}

// records returns the explicit members, by sequence number: what
// attachments.json holds of them besides the writer fields.
func (r writerRules) records() []ruleRecord {
	var out []ruleRecord
	for id, m := range r.members {
		if !m.implicit {
			out = append(out, ruleRecord{ID: id, Mode: m.mode, Seq: m.seq, Fenced: m.fenced})
		}
	}
	slices.SortFunc(out, func(a, b ruleRecord) int { return compareUint(a.Seq, b.Seq) })
	return out
}

func compareUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// restoreRules rebuilds the rule from what attachments.json holds: the
// writer fields and the explicit attachments. Implicit attachments do not
// survive a restart. An ro record is never fenced, and the next sequence
// number is past every record's.
func restoreRules(epoch uint64, writer string, writerSeq, nextSeq uint64, recs []ruleRecord) writerRules {
	r := newWriterRules()
	r.epoch, r.writer, r.writerSeq, r.nextSeq = epoch, writer, writerSeq, max(nextSeq, 1)
	for _, rec := range recs {
		mode := ModeReadWrite
		if rec.Mode == ModeReadOnly {
			mode = ModeReadOnly
		}
		r.members[rec.ID] = ruleMember{seq: rec.Seq, mode: mode, fenced: rec.Fenced && mode != ModeReadOnly}
		if mode == ModeReadWrite {
			r.explicitRW++
		}
		r.nextSeq = max(r.nextSeq, rec.Seq+1)
	}
	return r
}
