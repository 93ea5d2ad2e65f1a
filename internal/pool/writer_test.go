package pool

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// ruleEvent is one event of a writerRules sequence, as the tests write it:
// "attach A rw", "attach A ro", "implicit I", "detach A", "claim A",
// "transfer A", "reload".
type ruleEvent string

// ruleRun drives writerRules through events, naming attachments by label.
type ruleRun struct {
	r writerRules
}

func (run *ruleRun) do(ev ruleEvent) (ruleChange, error) {
	f := strings.Fields(string(ev))
	var (
		next writerRules
		ch   ruleChange
		err  error
	)
	switch f[0] {
	case "attach":
		next, _, ch, err = run.r.attach(f[1], f[2], false)
	case "implicit":
		next, _, ch, err = run.r.attach(f[1], ModeReadWrite, true)
	case "detach":
		next, ch, err = run.r.detach(f[1])
	case "claim":
		next, ch, err = run.r.claim(f[1])
	case "transfer":
		next, ch, err = run.r.transfer(f[1])
	case "detach-all":
		next = run.r.detachAll()
	case "reload":
		next, err = reloadRules(run.r)
	default:
		panic("unknown event " + string(ev))
	}
	run.r = next
	return ch, err
}

// reloadRules writes r as attachments.json, reads it back and restores it,
// as a restart does.
func reloadRules(r writerRules) (writerRules, error) {
	byID := map[string]*Attachment{}
	for _, rec := range r.records() {
		byID[rec.ID] = &Attachment{id: rec.ID, node: "node-" + strings.ToLower(rec.ID),
			token: strings.Repeat("ab", 32)}
	}
	b, err := json.Marshal(attachFile(r, byID))
	if err != nil {
		return r, err
	}
	st, err := decodeAttachments(b)
	if err != nil {
		return r, err
	}
	recs := make([]ruleRecord, 0, len(st.Attachments))
	for _, a := range st.Attachments {
		recs = append(recs, ruleRecord{ID: a.ID, Mode: a.Mode, Seq: a.Seq, Fenced: a.Fenced})
	}
	return restoreRules(st.Epoch, st.Writer, st.WriterSeq, st.NextSeq, recs), nil
}

// admitted lists the attachments whose write to a disk that is not shared
// goes ahead now.
func admitted(r writerRules) []string {
	var out []string
	for id := range r.members {
		if r.admit(id, false) == nil {
			out = append(out, id)
		}
	}
	return out
}

func TestWriterRulesTransitions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		start   writerRules // zero: newWriterRules()
		events  []ruleEvent
		last    error    // the last event's error
		fenced  []string // the last event's fenced set
		persist bool     // the last event's persist flag
		writer  string
		epoch   uint64
		admit   []string // admitted writers after the last event
	}{
		{name: "first write claims", events: []ruleEvent{"attach A rw", "claim A"},
			persist: true, writer: "A", epoch: 1, admit: []string{"A"}},
		{name: "attach persists, no writer", events: []ruleEvent{"attach A rw"}, persist: true},
		{name: "migration: newer claims, older fenced",
			events: []ruleEvent{"attach A rw", "claim A", "attach B rw", "claim B"},
			fenced: []string{"A"}, persist: true, writer: "B", epoch: 2, admit: []string{"B"}},
		{name: "older never takes the role back",
			events: []ruleEvent{"attach A rw", "attach B rw", "claim B", "claim A"},
			last:   ErrFenced, writer: "B", epoch: 1, admit: []string{"B"}},
		{name: "older unfenced claimer is fenced, persisted",
			start: restoreRules(2, "B", 2, 3, []ruleRecord{{ID: "A", Mode: ModeReadWrite, Seq: 1},
				{ID: "B", Mode: ModeReadWrite, Seq: 2}}),
			events: []ruleEvent{"claim A"},
			last:   ErrFenced, fenced: []string{"A"}, persist: true, writer: "B", epoch: 2, admit: []string{"B"}},
		{name: "transfer fences newer ones too",
			events: []ruleEvent{"attach A rw", "attach B rw", "claim B", "transfer A"},
			fenced: []string{"B"}, persist: true, writer: "A", epoch: 2, admit: []string{"A"}},
		{name: "later attachment may claim after a transfer",
			events: []ruleEvent{"attach A rw", "attach B rw", "transfer A", "attach C rw", "claim C"},
			fenced: []string{"A", "B"}, persist: true, writer: "C", epoch: 2, admit: []string{"C"}},
		{name: "ro is never fenced", events: []ruleEvent{"attach R ro", "attach A rw", "claim A"},
			persist: true, writer: "A", epoch: 1, admit: []string{"A"}},
		{name: "ro cannot claim", events: []ruleEvent{"attach R ro", "claim R"}, last: ErrReadOnly},
		{name: "ro cannot take a transfer", events: []ruleEvent{"attach R ro", "transfer R"}, last: ErrReadOnly},
		{name: "implicit group shares the role",
			events: []ruleEvent{"implicit I1", "implicit I2", "claim I1", "claim I2"},
			writer: ImplicitWriter, epoch: 1, admit: []string{"I1", "I2"}},
		{name: "implicit attach is not persisted", events: []ruleEvent{"implicit I1"}},
		{name: "implicit is read-only beside an explicit rw attachment",
			events: []ruleEvent{"attach A rw", "implicit I", "claim I"}, last: ErrReadOnly},
		{name: "earlier implicit may not write beside an explicit rw attachment",
			events: []ruleEvent{"implicit I", "claim I", "attach A rw", "claim I"},
			last:   errTokenlessReadOnly, persist: false, writer: ImplicitWriter, epoch: 1},
		{name: "explicit rw attachment fences the implicit group",
			events: []ruleEvent{"implicit I1", "implicit I2", "claim I1", "attach A rw", "claim A"},
			fenced: []string{"I1", "I2"}, persist: true, writer: "A", epoch: 2, admit: []string{"A"}},
		{name: "implicit writes again after the last explicit rw detach",
			events:  []ruleEvent{"attach A rw", "claim A", "detach A", "implicit I", "claim I"},
			persist: true, writer: ImplicitWriter, epoch: 2, admit: []string{"I"}},
		{name: "detached cannot claim", events: []ruleEvent{"attach A rw", "detach A", "claim A"},
			last: errNotAttached},
		{name: "detach of an unknown attachment", events: []ruleEvent{"detach A"}, last: errNotAttached},
		{name: "transfer to an unknown attachment", events: []ruleEvent{"transfer A"}, last: ErrAttachmentNotFound},
		{name: "fenced stays fenced across a reload",
			events: []ruleEvent{"attach A rw", "claim A", "attach B rw", "claim B", "reload", "claim A"},
			last:   ErrFenced, writer: "B", epoch: 2, admit: []string{"B"}},
		{name: "detach all keeps the writer fields",
			events:  []ruleEvent{"attach A rw", "claim A", "implicit I", "detach-all", "attach B rw"},
			persist: true, writer: "A", epoch: 1},
		{name: "reload forgets implicit attachments, keeps the group's role",
			events: []ruleEvent{"implicit I", "claim I", "reload"}, writer: ImplicitWriter, epoch: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := &ruleRun{r: tc.start}
			if run.r.members == nil {
				run.r = newWriterRules()
			}
			var (
				ch  ruleChange
				err error
			)
			for i, ev := range tc.events {
				ch, err = run.do(ev)
				if i < len(tc.events)-1 && err != nil {
					t.Fatalf("%s: %v", ev, err)
				}
			}
			if !errors.Is(err, tc.last) || (tc.last == nil) != (err == nil) {
				t.Errorf("last event: error %v, want %v", err, tc.last)
			}
			if fmt.Sprint(ch.fenced) != fmt.Sprint(tc.fenced) && (len(ch.fenced) != 0 || len(tc.fenced) != 0) {
				t.Errorf("fenced %v, want %v", ch.fenced, tc.fenced)
			}
			if ch.persist != tc.persist {
				t.Errorf("persist %v, want %v", ch.persist, tc.persist)
			}
			if run.r.writer != tc.writer || run.r.epoch != tc.epoch {
				t.Errorf("writer %q epoch %d, want %q %d", run.r.writer, run.r.epoch, tc.writer, tc.epoch)
			}
			got := admitted(run.r)
			if fmt.Sprint(sortedCopy(got)) != fmt.Sprint(sortedCopy(tc.admit)) {
				t.Errorf("admitted %v, want %v", got, tc.admit)
			}
		})
	}
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// FuzzWriterRules drives random event sequences through writerRules and
// checks the single-writer invariants after every step. Each byte is one
// event: the low three bits pick it (attach rw, attach ro, implicit attach,
// detach, claim, transfer, reload), the rest pick the attachment.
func FuzzWriterRules(f *testing.F) {
	f.Add([]byte{0, 4, 0, 4 | 8, 6, 4})
	f.Add([]byte{2, 2, 4, 0, 4 | 16, 3 | 16, 2, 4 | 24})
	f.Add([]byte{0, 0, 4 | 8, 5, 4, 6, 5 | 8, 1, 4 | 16})
	f.Fuzz(func(t *testing.T, events []byte) {
		if len(events) > 200 {
			events = events[:200]
		}
		r := newWriterRules()
		var ids []string // every attachment ever made, in order
		// fenced holds attachments fenced since they last took a transfer.
		fenced := map[string]bool{}
		for step, b := range events {
			prev := r
			var id string
			if len(ids) > 0 {
				id = ids[int(b>>3)%len(ids)]
			}
			var (
				next   writerRules
				ch     ruleChange
				err    error
				desc   string
				reload bool
			)
			switch b & 7 {
			case 0, 1:
				mode := ModeReadWrite
				if b&7 == 1 {
					mode = ModeReadOnly
				}
				id = fmt.Sprintf("att-%d", len(ids))
				desc = "attach " + id + " " + mode
				next, _, ch, err = r.attach(id, mode, false)
				if err == nil {
					ids = append(ids, id)
				}
			case 2:
				id = fmt.Sprintf("implicit-%d", len(ids))
				desc = "implicit " + id
				next, _, ch, err = r.attach(id, ModeReadWrite, true)
				if err == nil {
					ids = append(ids, id)
				}
			case 3:
				if id == "" {
					continue
				}
				desc = "detach " + id
				next, ch, err = r.detach(id)
			case 4, 7:
				if id == "" {
					continue
				}
				desc = "claim " + id
				next, ch, err = r.claim(id)
			case 5:
				if id == "" {
					continue
				}
				desc = "transfer " + id
				next, ch, err = r.transfer(id)
			case 6:
				desc, reload = "reload", true
				next, err = reloadRules(r)
				if err != nil {
					t.Fatalf("step %d %s: %v", step, desc, err)
				}
			}
			m, existed := prev.members[id]
			fail := func(format string, args ...any) {
				t.Helper()
				t.Fatalf("step %d %s: "+format, append([]any{step, desc}, args...)...)
			}
			if err != nil && !reflect.DeepEqual(next, prev) && !(strings.HasPrefix(desc, "claim") && errors.Is(err, ErrFenced)) {
				fail("failed (%v) but changed the state", err)
			}
			// What changes on disk is persisted first; only the next
			// sequence number may move unwritten (an implicit attachment's:
			// it ends with a restart).
			if !reload && !ch.persist {
				before, _ := reloadRules(prev)
				after, _ := reloadRules(next)
				before.nextSeq, after.nextSeq = 0, 0
				if !reflect.DeepEqual(before, after) {
					fail("the persisted state changes but persist is not set")
				}
			}
			// The epoch never decreases and grows on every change of writer.
			if next.epoch < prev.epoch {
				fail("epoch went back from %d to %d", prev.epoch, next.epoch)
			}
			if next.writer != prev.writer && next.epoch == prev.epoch {
				fail("writer moved from %q to %q at epoch %d", prev.writer, next.writer, next.epoch)
			}
			if next.epoch != prev.epoch && !ch.writerMoved {
				fail("epoch moved without writerMoved")
			}
			// An implicit attachment never takes the role while an explicit
			// rw attachment exists.
			if strings.HasPrefix(desc, "claim") && existed && m.implicit && prev.explicitRW > 0 && (err == nil || next.writer != prev.writer) {
				fail("implicit claim beside an explicit rw attachment: err %v, writer %q", err, next.writer)
			}
			// A fenced attachment becomes writer again only by a transfer.
			if strings.HasPrefix(desc, "transfer") && err == nil {
				delete(fenced, id)
			}
			for fid := range fenced {
				if fm, ok := next.members[fid]; ok && !fm.fenced {
					fail("fenced %s is no longer fenced", fid)
				}
				if next.admit(fid, false) == nil {
					fail("fenced %s may write", fid)
				}
			}
			for fid, fm := range next.members {
				if fm.fenced {
					fenced[fid] = true
				}
			}
			checkRuleInvariants(t, next, ids, func(format string, args ...any) { fail(format, args...) })
			// A reload gives the same state, less the implicit attachments.
			back, err := reloadRules(next)
			if err != nil {
				fail("reload: %v", err)
			}
			if want := withoutImplicit(next); !reflect.DeepEqual(back, want) {
				fail("reload gives %+v, want %+v", back, want)
			}
			r = next
		}
	})
}

// checkRuleInvariants checks what holds of every writerRules value.
func checkRuleInvariants(t *testing.T, r writerRules, ids []string, fail func(string, ...any)) {
	t.Helper()
	// At most one writer group, and it is the writer.
	groups := map[string]bool{}
	for _, id := range admitted(r) {
		groups[r.members[id].group(id)] = true
		if r.members[id].group(id) != r.writer {
			fail("%s may write but the writer is %q", id, r.writer)
		}
	}
	if len(groups) > 1 {
		fail("%d writer groups: %v", len(groups), groups)
	}
	explicitRW, seqs := 0, map[uint64]bool{}
	for id, m := range r.members {
		if seqs[m.seq] || m.seq >= r.nextSeq {
			fail("%s: sequence number %d reused or not below %d", id, m.seq, r.nextSeq)
		}
		seqs[m.seq] = true
		if !m.implicit && m.mode == ModeReadWrite {
			explicitRW++
		}
		// Read-only attachments are never fenced and never write.
		if m.mode == ModeReadOnly {
			if m.fenced || r.isWriter(id) || r.admit(id, false) == nil || r.admit(id, true) == nil {
				fail("ro %s: fenced %v writer %v", id, m.fenced, r.isWriter(id))
			}
		}
	}
	if explicitRW != r.explicitRW {
		fail("explicitRW %d, counted %d", r.explicitRW, explicitRW)
	}
	for id, m := range r.members {
		if m.implicit && explicitRW > 0 && (r.admit(id, false) == nil || r.admit(id, true) == nil) {
			fail("implicit %s may write beside an explicit rw attachment", id)
		}
	}
	// A detached attachment is gone from every set.
	for _, id := range ids {
		if _, ok := r.members[id]; ok {
			continue
		}
		if r.admit(id, true) == nil || r.isWriter(id) {
			fail("detached %s may write", id)
		}
		if _, _, err := r.claim(id); !errors.Is(err, errNotAttached) {
			fail("detached %s claims: %v", id, err)
		}
		for _, rec := range r.records() {
			if rec.ID == id {
				fail("detached %s is persisted", id)
			}
		}
	}
	if r.writer != "" && r.writerSeq >= r.nextSeq {
		fail("writerSeq %d not below nextSeq %d", r.writerSeq, r.nextSeq)
	}
}

func withoutImplicit(r writerRules) writerRules {
	out := r
	out.members = map[string]ruleMember{}
	for id, m := range r.members {
		if !m.implicit {
			out.members[id] = m
		}
	}
	return out
}
