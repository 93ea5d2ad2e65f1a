package pool

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// Attachments and the single-writer rule.
//
// An attachment lets one node reach every disk of a volume. Each has a
// sequence number that grows with creation order. A volume has one writer
// at a time, named by a writer group: an attachment's ID, or ImplicitWriter
// for the tokenless loopback connections, which act as one writer among
// themselves so multi-connection tools keep working.
//
// A write by an attachment outside the writer group claims the role when the
// attachment is newer than the current writer's claim: the epoch grows by
// one and every attachment of another group that is older than the claimer
// is fenced. A fenced attachment's writes, trims and zeroes fail with
// ErrFenced and are never applied; its flushes succeed without effect; its
// reads work. The check runs under the volume's I/O gate held shared, and a
// claim takes the gate exclusively, so a write is either admitted before the
// claim (and completes before it) or refused after it: a write still waiting
// for the gate when the epoch changes is refused.
//
// Transfer gives the role to a chosen attachment and fences every other
// existing rw one. Attachments created later are newer and may still claim.
// Read-only attachments are never fenced: they never write.
//
// While an explicit rw attachment exists, tokenless connections are
// read-only (opened ro, or refused with ErrReadOnly if opened before): a
// tool run by hand on the storage node must not take the role from a node.
//
// attachments.json in the volume directory holds the epoch, the writer and
// the explicit attachments, written atomically before a change takes effect,
// so epochs and fencing survive a restart. Implicit attachments live only as
// long as their connection.
//
// The rule itself is writerRules (writer.go), a pure state machine: this
// file holds the attachments' identities (node, token, connections), takes
// the locks, feeds events to the rule, persists what it returns and then
// publishes it.

// ImplicitWriter is the writer group of tokenless loopback connections.
const ImplicitWriter = "implicit"

// Attachment modes.
const (
	ModeReadWrite = "rw"
	ModeReadOnly  = "ro"
)

// ErrFenced refuses a write from an attachment that lost the writer role or
// was detached.
var ErrFenced = errors.New("fenced: another attachment holds the writer role")

// ErrUnauthorized refuses a missing or unknown attachment token.
var ErrUnauthorized = errors.New("missing or unknown attachment token")

// ErrInUse refuses to delete a volume that still has attachments, and a
// destructive operation (rollback, disk removal) on a volume that has
// connected writers, unless forced.
var ErrInUse = errors.New("in use")

// Attachment states, as AttachmentInfo.State reports them.
const (
	StateWriter   = "writer"    // holds the writer role
	StateStandby  = "standby"   // may write: its first write claims the role
	StateFenced   = "fenced"    // lost the role: its writes are refused
	StateReadOnly = "read-only" // never writes: an ro attachment, or a tokenless connection while an explicit rw attachment exists
)

const attachmentsFile = "attachments.json"

// attachState is attachments.json.
type attachState struct {
	Kind        string         `json:"kind"`
	Version     int            `json:"version"`
	Epoch       uint64         `json:"epoch"`
	Writer      string         `json:"writer,omitempty"`
	WriterSeq   uint64         `json:"writerSeq,omitempty"`
	NextSeq     uint64         `json:"nextSeq"`
	Attachments []attachRecord `json:"attachments"`
}

type attachRecord struct {
	ID        string    `json:"id"`
	Node      string    `json:"node"`
	Mode      string    `json:"mode"`
	Token     string    `json:"token"`
	Seq       uint64    `json:"seq"`
	Fenced    bool      `json:"fenced,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	// IdempotencyKey is the key of the request that made the attachment.
	IdempotencyKey string `json:"idempotencyKey,omitempty"`
}

// Attachment is one node's access to a volume. Its handles' writes obey the
// single-writer rule.
type Attachment struct {
	v        *Volume
	id       string
	node     string
	mode     string
	token    string
	implicit bool
	created  time.Time
	idemKey  string // the key of the request that made it

	// detached changes under the gate held exclusively (an implicit
	// attachment ends when its last handle closes, with no writes of its
	// own in flight). Whether it is fenced is in the volume's writerRules.
	detached atomic.Bool
	done     chan struct{} // closed on detach
	conns    atomic.Int32  // open disk handles
}

// AttachmentInfo is a view of an attachment.
type AttachmentInfo struct {
	ID        string
	Volume    string
	Node      string
	Mode      string
	Token     string // set only by Attach
	Implicit  bool
	Writer    bool
	Fenced    bool
	State     string // StateWriter, StateStandby, StateFenced or StateReadOnly
	Conns     int
	CreatedAt time.Time
}

// WriterInfo is a volume's single-writer state.
type WriterInfo struct {
	Epoch  uint64
	Writer string // attachment ID, ImplicitWriter, or "" before any write
}

// attachTable is a volume's attachments; it lives under Volume.amu. What
// the single-writer rule knows of them is in Volume.rules.
type attachTable struct {
	byID map[string]*Attachment
	// deleting is set, with the gate held exclusively, once Delete has
	// found no explicit attachment: Attach then refuses.
	deleting bool
}

// ID returns the attachment's ID.
func (a *Attachment) ID() string { return a.id }

// Done is closed when the attachment is detached: its connections should
// close.
func (a *Attachment) Done() <-chan struct{} { return a.done }

// ReadOnly reports whether the attachment may never write.
func (a *Attachment) ReadOnly() bool { return a.mode == ModeReadOnly }

func newToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// loadAttachments reads attachments.json (absent: none yet).
func (v *Volume) loadAttachments() error {
	v.att = attachTable{byID: map[string]*Attachment{}}
	r := newWriterRules()
	v.rules.Store(&r)
	var st attachState
	err := v.pool.readDecoded(path.Join("volumes", v.name, attachmentsFile), func(b []byte) (err error) {
		st, err = decodeAttachments(b)
		return err
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("attachments of volume %q: %w", v.name, err)
	}
	recs := make([]ruleRecord, 0, len(st.Attachments))
	for _, r := range st.Attachments {
		v.att.byID[r.ID] = &Attachment{v: v, id: r.ID, node: r.Node, mode: r.Mode, token: r.Token,
			created: r.CreatedAt, idemKey: r.IdempotencyKey, done: make(chan struct{})}
		recs = append(recs, ruleRecord{ID: r.ID, Mode: r.Mode, Seq: r.Seq, Fenced: r.Fenced})
	}
	r = restoreRules(st.Epoch, st.Writer, st.WriterSeq, st.NextSeq, recs)
	v.rules.Store(&r)
	return nil
}

// attachFile is attachments.json holding r, with each explicit
// attachment's node, token and the rest from byID.
func attachFile(r writerRules, byID map[string]*Attachment) attachState {
	st := attachState{Kind: "Attachments", Version: 1, Epoch: r.epoch, Writer: r.writer, WriterSeq: r.writerSeq,
		NextSeq: r.nextSeq, Attachments: []attachRecord{}}
	for _, rec := range r.records() {
		a := byID[rec.ID]
		st.Attachments = append(st.Attachments, attachRecord{ID: rec.ID, Node: a.node, Mode: rec.Mode,
			Token: a.token, Seq: rec.Seq, Fenced: rec.Fenced, CreatedAt: a.created, IdempotencyKey: a.idemKey})
	}
	return st
}

// applyRules (amu held; gate held exclusively if the writer or a fenced
// flag changes) carries out ch: it writes attachments.json with next and
// the attachments byID, durable, if ch asks, and then publishes next. On
// a failed write nothing changes.
func (v *Volume) applyRules(next writerRules, ch ruleChange, byID map[string]*Attachment) error {
	if ch.persist {
		st := attachFile(next, byID)
		if err := v.publishAttachments(st); err != nil {
			return err
		}
		if err := v.pool.writeJSON(filepath.Join(v.dir, attachmentsFile), st); err != nil {
			return v.metaError(err)
		}
	}
	v.rules.Store(&next)
	return nil
}

func validateMode(mode string) (string, error) {
	switch mode {
	case "", ModeReadWrite:
		return ModeReadWrite, nil
	case ModeReadOnly:
		return ModeReadOnly, nil
	}
	return "", invalid("mode", mode, `must be "rw" or "ro"`)
}

// Attach creates an attachment of the volume for node; a node already
// attached fails with ErrExists. See AttachWith.
func (v *Volume) Attach(node, mode string) (AttachmentInfo, bool, error) {
	return v.AttachWith(node, mode, Idempotency{})
}

// AttachWith creates an attachment of the volume for node, durable on
// return, and returns it with its token. A node already attached fails with
// ErrExists, unless idem allows its attachment and the mode is the same:
// then that attachment is returned (created false) with its token.
func (v *Volume) AttachWith(node, mode string, idem Idempotency) (AttachmentInfo, bool, error) {
	if err := ValidateNodeName(node); err != nil {
		return AttachmentInfo{}, false, err
	}
	if err := ValidateIdempotencyKey("idempotency key", idem.Key); err != nil {
		return AttachmentInfo{}, false, err
	}
	mode, err := validateMode(mode)
	if err != nil {
		return AttachmentInfo{}, false, err
	}
	if err := v.pool.checkWritable("attach " + v.name); err != nil {
		return AttachmentInfo{}, false, err
	}
	if err := v.checkAlive(); err != nil {
		return AttachmentInfo{}, false, err
	}
	v.amu.Lock()
	defer v.amu.Unlock()
	if v.att.deleting {
		return AttachmentInfo{}, false, fmt.Errorf("volume %q is being deleted: %w", v.name, ErrVolumeNotFound)
	}
	explicit := 0
	for _, a := range v.att.byID {
		if a.implicit {
			continue
		}
		explicit++
		if a.node == node {
			if a.mode != mode {
				return AttachmentInfo{}, false, fmt.Errorf("node %q is already attached to volume %q with mode %s (attachment %s); detach it first: %w", node, v.name, a.mode, a.id, ErrExists)
			}
			if !idem.allows(a.idemKey) {
				return AttachmentInfo{}, false, fmt.Errorf("node %q is already attached to volume %q (attachment %s); use its token, or detach it first: %w", node, v.name, a.id, ErrExists)
			}
			info := v.attachmentInfo(a)
			info.Token = a.token
			return info, false, nil
		}
	}
	if explicit >= MaxAttachments {
		return AttachmentInfo{}, false, invalid("node", node, fmt.Sprintf("volume already has %d attachments, the maximum; detach one first", MaxAttachments))
	}
	a := &Attachment{v: v, id: "att-" + newUID()[:16], node: node, mode: mode, token: newToken(),
		created: time.Now().UTC(), idemKey: idem.Key, done: make(chan struct{})}
	// The writer fields do not change: the gate is not needed.
	next, _, ch, err := v.rules.Load().attach(a.id, mode, false)
	if err != nil {
		return AttachmentInfo{}, false, fmt.Errorf("attach %s to volume %q: %w", node, v.name, err)
	}
	byID := maps.Clone(v.att.byID)
	byID[a.id] = a
	if err := v.applyRules(next, ch, byID); err != nil {
		return AttachmentInfo{}, false, err
	}
	v.att.byID = byID
	info := v.attachmentInfo(a)
	info.Token = a.token
	return info, true, nil
}

// OpenImplicit opens a disk for one tokenless connection through an
// implicit attachment of its own, in the implicit writer group, gone when
// the handle closes. It is rw, unless the volume has an explicit rw
// attachment: then it is read-only, so a tool run by hand on the storage
// node cannot take the writer role from a node's VM.
func (v *Volume) OpenImplicit(peer, disk string) (Disk, *Attachment, error) {
	a, err := v.attachImplicit(peer)
	if err != nil {
		return nil, nil, err
	}
	a.opened()
	d, err := v.openDisk(disk, a)
	if err != nil {
		a.released()
		return nil, nil, err
	}
	return d, a, nil
}

func (v *Volume) attachImplicit(peer string) (*Attachment, error) {
	if err := v.checkAlive(); err != nil {
		return nil, err
	}
	v.amu.Lock()
	defer v.amu.Unlock()
	if v.att.deleting {
		return nil, fmt.Errorf("volume %q is being deleted: %w", v.name, ErrVolumeNotFound)
	}
	if len(v.att.byID) >= MaxImplicitAttachments {
		return nil, fmt.Errorf("volume %q already has %d connections, the maximum: %w", v.name, MaxImplicitAttachments, ErrBusy)
	}
	id := "implicit-" + newUID()[:12]
	next, m, ch, err := v.rules.Load().attach(id, ModeReadWrite, true)
	if err != nil {
		return nil, fmt.Errorf("volume %q: %w", v.name, err)
	}
	if m.mode == ModeReadOnly {
		v.pool.log.Info("tokenless connection is read-only: the volume has an rw attachment; connect with its token to write",
			"volume", v.name, "peer", peer)
	}
	a := &Attachment{v: v, id: id, node: peer, mode: m.mode, implicit: true, created: time.Now().UTC(),
		done: make(chan struct{})}
	if err := v.applyRules(next, ch, v.att.byID); err != nil {
		return nil, err
	}
	v.att.byID[a.id] = a
	return a, nil
}

// AttachmentByToken returns the attachment whose token is token.
func (v *Volume) AttachmentByToken(token string) (*Attachment, error) {
	if err := v.checkAlive(); err != nil {
		return nil, err
	}
	v.amu.Lock()
	defer v.amu.Unlock()
	var found *Attachment
	for _, a := range v.att.byID {
		if !a.implicit && subtle.ConstantTimeCompare([]byte(a.token), []byte(token)) == 1 {
			found = a
		}
	}
	if found == nil {
		return nil, fmt.Errorf("volume %q: %w", v.name, ErrUnauthorized)
	}
	return found, nil
}

// Attachments lists the volume's attachments by age, implicit ones included,
// without tokens.
func (v *Volume) Attachments() []AttachmentInfo {
	v.amu.Lock()
	defer v.amu.Unlock()
	out := make([]AttachmentInfo, 0, len(v.att.byID))
	for _, a := range v.att.byID {
		out = append(out, v.attachmentInfo(a))
	}
	slices.SortFunc(out, func(a, b AttachmentInfo) int { return a.CreatedAt.Compare(b.CreatedAt) })
	return out
}

// Attachment returns one attachment, without its token.
func (v *Volume) Attachment(id string) (AttachmentInfo, error) {
	v.amu.Lock()
	defer v.amu.Unlock()
	a, ok := v.att.byID[id]
	if !ok {
		return AttachmentInfo{}, fmt.Errorf("attachment %q of volume %q: %w", id, v.name, ErrAttachmentNotFound)
	}
	return v.attachmentInfo(a), nil
}

// attachmentInfo (amu held).
func (v *Volume) attachmentInfo(a *Attachment) AttachmentInfo {
	r := v.rules.Load()
	m, _ := r.member(a.id)
	info := AttachmentInfo{ID: a.id, Volume: v.name, Node: a.node, Mode: a.mode, Implicit: a.implicit,
		Writer: r.isWriter(a.id), Fenced: a.mode == ModeReadWrite && m.fenced, Conns: int(a.conns.Load()),
		CreatedAt: a.created}
	switch {
	case a.mode == ModeReadOnly, a.implicit && r.explicitRW > 0:
		info.State = StateReadOnly
	case info.Fenced:
		info.State = StateFenced
	case info.Writer:
		info.State = StateWriter
	default:
		info.State = StateStandby
	}
	return info
}

// Writer returns the volume's single-writer state.
func (v *Volume) Writer() WriterInfo {
	v.amu.Lock()
	defer v.amu.Unlock()
	r := v.rules.Load()
	return WriterInfo{Epoch: r.epoch, Writer: r.writer}
}

// Detach removes an attachment, durable on return: writes through it fail
// from then on (any admitted before have completed) and Done is closed so
// its connections close.
func (v *Volume) Detach(id string) error {
	if err := v.pool.checkWritable("detach " + id); err != nil {
		return err
	}
	v.gate.Lock()
	defer v.gate.Unlock()
	v.amu.Lock()
	defer v.amu.Unlock()
	a, ok := v.att.byID[id]
	if !ok {
		return fmt.Errorf("attachment %q of volume %q: %w", id, v.name, ErrAttachmentNotFound)
	}
	next, ch, err := v.rules.Load().detach(id)
	if err != nil {
		return fmt.Errorf("attachment %q of volume %q: %w", id, v.name, ErrAttachmentNotFound)
	}
	byID := maps.Clone(v.att.byID)
	delete(byID, id)
	if err := v.applyRules(next, ch, byID); err != nil {
		return err
	}
	v.att.byID = byID
	if !a.detached.Swap(true) {
		close(a.done)
	}
	return nil
}

// Transfer gives the writer role to attachment id: the epoch grows by one and
// every other attachment is fenced. Durable on return.
func (v *Volume) Transfer(id string) (AttachmentInfo, error) {
	if err := v.pool.checkWritable("transfer " + id); err != nil {
		return AttachmentInfo{}, err
	}
	v.gate.Lock()
	defer v.gate.Unlock()
	v.amu.Lock()
	defer v.amu.Unlock()
	a, ok := v.att.byID[id]
	if !ok {
		return AttachmentInfo{}, fmt.Errorf("attachment %q of volume %q: %w", id, v.name, ErrAttachmentNotFound)
	}
	next, ch, err := v.rules.Load().transfer(id)
	switch {
	case errors.Is(err, ErrReadOnly):
		return AttachmentInfo{}, invalid("attachment", id, "is read-only and cannot hold the writer role")
	case err != nil:
		return AttachmentInfo{}, fmt.Errorf("attachment %q of volume %q: %w", id, v.name, err)
	}
	if err := v.applyRules(next, ch, v.att.byID); err != nil {
		return AttachmentInfo{}, err
	}
	v.pool.log.Info("writer role transferred", "volume", v.name, "attachment", a.id, "epoch", next.epoch)
	return v.attachmentInfo(a), nil
}

// mayWrite (gate held shared) says whether a may write disk df now:
// errMustClaim if it must claim the writer role first.
func (a *Attachment) mayWrite(df *diskFile) error {
	if a == nil {
		return nil // an internal handle
	}
	if a.mode == ModeReadOnly {
		return fmt.Errorf("attachment %s is read-only: %w", a.id, ErrReadOnly)
	}
	if a.detached.Load() {
		return a.ruleError(errNotAttached)
	}
	return a.ruleError(a.v.rules.Load().admit(a.id, df.shared))
}

// ruleError words an error of the writer rule for a.
func (a *Attachment) ruleError(err error) error {
	switch {
	case errors.Is(err, errNotAttached):
		return fmt.Errorf("attachment %s was detached: %w", a.id, ErrFenced)
	case errors.Is(err, errTokenlessReadOnly):
		return fmt.Errorf("volume %q has an rw attachment, so connections without its token are read-only "+
			"(connect with the attachment's token: quiver attach list %s): %w", a.v.name, a.v.name, ErrReadOnly)
	case errors.Is(err, ErrFenced):
		return fmt.Errorf("attachment %s of volume %q: %w", a.id, a.v.name, ErrFenced)
	case errors.Is(err, ErrReadOnly):
		return fmt.Errorf("attachment %s is read-only: %w", a.id, ErrReadOnly)
	}
	return err
}

// claim takes the gate exclusively and makes a the writer if it is newer
// than the current writer's claim; otherwise fences it (writerRules.claim).
func (a *Attachment) claim() error {
	v := a.v
	v.gate.Lock()
	defer v.gate.Unlock()
	v.amu.Lock()
	defer v.amu.Unlock()
	if a.detached.Load() {
		return a.ruleError(errNotAttached)
	}
	old := v.rules.Load()
	next, ch, err := old.claim(a.id)
	if aerr := v.applyRules(next, ch, v.att.byID); aerr != nil {
		return aerr
	}
	if err != nil {
		return a.ruleError(err)
	}
	if ch.writerMoved {
		v.pool.log.Info("writer role claimed", "volume", v.name, "attachment", a.id, "node", a.node,
			"epoch", next.epoch, "previous", old.writer, "fenced", len(ch.fenced))
	}
	return nil
}

// opened and released count the attachment's open handles; an implicit
// attachment goes away with its last handle.
func (a *Attachment) opened() { a.conns.Add(1) }

func (a *Attachment) released() {
	if a.conns.Add(-1) == 0 && a.implicit {
		v := a.v
		v.amu.Lock()
		if !a.detached.Swap(true) {
			if next, ch, err := v.rules.Load().detach(a.id); err == nil {
				_ = v.applyRules(next, ch, v.att.byID) // implicit: nothing to write
			}
			delete(v.att.byID, a.id)
			close(a.done)
		}
		v.amu.Unlock()
	}
}

// beginDelete (gate held exclusively) refuses to delete a volume with
// explicit attachments, and otherwise marks it deleting so that no
// attachment is made from then on.
func (v *Volume) beginDelete() error {
	v.amu.Lock()
	defer v.amu.Unlock()
	for _, a := range v.att.byID {
		if !a.implicit {
			return fmt.Errorf("delete volume %q: detach it first (quiver attach list %s): %w", v.name, v.name, ErrInUse)
		}
	}
	v.att.deleting = true
	return nil
}

// cancelDelete undoes beginDelete after a failed delete.
func (v *Volume) cancelDelete() {
	v.amu.Lock()
	v.att.deleting = false
	v.amu.Unlock()
}

// detachAllLocked (gate exclusive) ends every attachment of a volume being
// deleted, so their connections close.
func (v *Volume) detachAllLocked() {
	v.amu.Lock()
	defer v.amu.Unlock()
	for id, a := range v.att.byID {
		if !a.detached.Swap(true) {
			close(a.done)
		}
		delete(v.att.byID, id)
	}
	r := v.rules.Load().detachAll()
	v.rules.Store(&r)
}

// CheckWriters refuses, with ErrInUse, an operation that changes the disks
// under the volume's connected writers: rw attachments (explicit or
// implicit, fenced ones too: their VM may still run) with open handles.
// op names the operation in the message.
func (v *Volume) CheckWriters(op string) error {
	v.amu.Lock()
	defer v.amu.Unlock()
	var who []string
	for _, a := range v.att.byID {
		if a.mode != ModeReadWrite || a.detached.Load() {
			continue
		}
		if n := a.conns.Load(); n > 0 {
			who = append(who, fmt.Sprintf("%s on %s: %d connection(s)", a.id, a.node, n))
		}
	}
	if len(who) == 0 {
		return nil
	}
	slices.Sort(who)
	return fmt.Errorf("%s of volume %q would change the disks under its connected writers (%s): stop them first "+
		"(quiver attach list %s), or force it if they are gone: %w", op, v.name, strings.Join(who, "; "), v.name, ErrInUse)
}
