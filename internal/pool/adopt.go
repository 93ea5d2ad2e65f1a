package pool

import (
	"encoding/json"
	"fmt"
	"path/filepath"
)

// Attachments that move with a volume (a cluster's failover, docs/cluster.md).
//
// On a cluster, the attachments and the writer state of a replicated volume
// live on its primary's pool. So that a copy promoted to primary accepts the
// same tokens and fences the same attachments, the primary publishes every
// change of its attachment state before the change takes effect
// (AttachmentsHook), and the promoted copy adopts the last published state
// (AdoptAttachments) before it serves.

// AttachmentsHook is called with a volume's attachment state, as
// attachments.json will hold it, before each change of it is written; an
// error refuses the change, which then has no effect. It runs with the
// volume's attachment lock held (and its I/O gate, for a claim or a
// transfer): it must not call back into the volume.
type AttachmentsHook func(volume string, state []byte) error

// SetAttachmentsHook sets the hook for every volume of the pool (nil: none).
// Set it before serving.
func (p *Pool) SetAttachmentsHook(fn AttachmentsHook) {
	p.mu.Lock()
	p.attachHook = fn
	p.mu.Unlock()
}

func (p *Pool) attachmentsHook() AttachmentsHook {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.attachHook
}

// publishAttachments runs the pool's hook, if any, with st.
func (v *Volume) publishAttachments(st attachState) error {
	hook := v.pool.attachmentsHook()
	if hook == nil {
		return nil
	}
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	if err := hook(v.name, b); err != nil {
		return fmt.Errorf("attachments of volume %q: %w", v.name, err)
	}
	return nil
}

// AttachmentState returns the volume's attachment state (the content of
// attachments.json: explicit attachments with their tokens, the epoch and
// the writer). It holds tokens: it is for the cluster's store, never for
// clients.
func (v *Volume) AttachmentState() ([]byte, error) {
	v.amu.Lock()
	defer v.amu.Unlock()
	return json.Marshal(attachFile(*v.rules.Load(), v.att.byID))
}

// AdoptAttachments replaces the volume's attachments and writer state with
// state (as AttachmentState returns it; empty: no attachment), durable on
// return. Every attachment the volume had before is ended: writes through
// it fail from then on (any admitted before have completed) and its
// connections close. Bad state is refused and nothing changes. The hook is
// not called: the state came from it.
func (v *Volume) AdoptAttachments(state []byte) error {
	st := attachState{Kind: "Attachments", Version: 1, NextSeq: 1, Attachments: []attachRecord{}}
	if len(state) > 0 {
		var err error
		if st, err = decodeAttachments(state); err != nil {
			return fmt.Errorf("adopt attachments of volume %q: %w", v.name, err)
		}
	}
	if err := v.pool.checkWritable("adopt attachments of " + v.name); err != nil {
		return err
	}
	v.gate.Lock()
	defer v.gate.Unlock()
	v.amu.Lock()
	defer v.amu.Unlock()
	byID := make(map[string]*Attachment, len(st.Attachments))
	recs := make([]ruleRecord, 0, len(st.Attachments))
	for _, r := range st.Attachments {
		byID[r.ID] = &Attachment{v: v, id: r.ID, node: r.Node, mode: r.Mode, token: r.Token,
			created: r.CreatedAt, idemKey: r.IdempotencyKey, done: make(chan struct{})}
		recs = append(recs, ruleRecord{ID: r.ID, Mode: r.Mode, Seq: r.Seq, Fenced: r.Fenced})
	}
	next := restoreRules(st.Epoch, st.Writer, st.WriterSeq, st.NextSeq, recs)
	if err := v.pool.writeJSON(filepath.Join(v.dir, attachmentsFile), attachFile(next, byID)); err != nil {
		return v.metaError(err)
	}
	for _, a := range v.att.byID {
		if !a.detached.Swap(true) {
			close(a.done)
		}
	}
	v.att.byID = byID
	v.rules.Store(&next)
	v.pool.log.Info("attachments adopted", "volume", v.name, "attachments", len(byID), "epoch", next.epoch,
		"writer", next.writer)
	return nil
}
