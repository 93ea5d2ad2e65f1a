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
	"sort"
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
	seq      uint64
	implicit bool
	created  time.Time
	idemKey  string // the key of the request that made it

	// fenced and detached change under the gate held exclusively (an
	// implicit attachment ends when its last handle closes, with no writes
	// of its own in flight).
	fenced   atomic.Bool
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

// attachTable is a volume's attachment state; it lives under Volume.amu,
// and its writer fields change only with the gate held exclusively too.
type attachTable struct {
	epoch     uint64
	writer    string
	writerSeq uint64
	nextSeq   uint64
	byID      map[string]*Attachment
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

func (a *Attachment) group() string {
	if a.implicit {
		return ImplicitWriter
	}
	return a.id
}

func (a *Attachment) record() attachRecord {
	return attachRecord{ID: a.id, Node: a.node, Mode: a.mode, Token: a.token, Seq: a.seq,
		Fenced: a.fenced.Load(), CreatedAt: a.created, IdempotencyKey: a.idemKey}
}

func newToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// loadAttachments reads attachments.json (absent: none yet).
func (v *Volume) loadAttachments() error {
	v.att = attachTable{byID: map[string]*Attachment{}, nextSeq: 1}
	v.explicitRW.Store(0)
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
	v.att.epoch, v.att.writer, v.att.writerSeq, v.att.nextSeq = st.Epoch, st.Writer, st.WriterSeq, max(st.NextSeq, 1)
	for _, r := range st.Attachments {
		a := &Attachment{v: v, id: r.ID, node: r.Node, mode: r.Mode, token: r.Token, seq: r.Seq,
			created: r.CreatedAt, idemKey: r.IdempotencyKey, done: make(chan struct{})}
		a.fenced.Store(r.Fenced && r.Mode != ModeReadOnly)
		v.att.byID[a.id] = a
		if a.mode == ModeReadWrite {
			v.explicitRW.Add(1)
		}
		v.att.nextSeq = max(v.att.nextSeq, r.Seq+1)
	}
	return nil
}

// saveAttachments writes t as attachments.json, durable on return. fenced
// overrides the fenced flag of the named attachments (the change being
// made); others keep theirs.
func (v *Volume) saveAttachments(t *attachTable, fenced map[string]bool) error {
	st := attachState{Kind: "Attachments", Version: 1, Epoch: t.epoch, Writer: t.writer, WriterSeq: t.writerSeq,
		NextSeq: t.nextSeq, Attachments: []attachRecord{}}
	for _, a := range t.byID {
		if a.implicit {
			continue
		}
		r := a.record()
		if f, ok := fenced[a.id]; ok {
			r.Fenced = f
		}
		st.Attachments = append(st.Attachments, r)
	}
	sort.Slice(st.Attachments, func(i, j int) bool { return st.Attachments[i].Seq < st.Attachments[j].Seq })
	if err := v.pool.writeJSON(filepath.Join(v.dir, attachmentsFile), st, true); err != nil {
		return v.metaError(err)
	}
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
		seq: v.att.nextSeq, created: time.Now().UTC(), idemKey: idem.Key, done: make(chan struct{})}
	// Only nextSeq and byID change: the writer fields are read under the
	// gate alone.
	next := v.att
	next.nextSeq++
	next.byID = maps.Clone(v.att.byID)
	next.byID[a.id] = a
	if err := v.saveAttachments(&next, nil); err != nil {
		return AttachmentInfo{}, false, err
	}
	v.att.nextSeq, v.att.byID = next.nextSeq, next.byID
	if a.mode == ModeReadWrite {
		v.explicitRW.Add(1)
	}
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
	mode := ModeReadWrite
	if v.explicitRW.Load() > 0 {
		mode = ModeReadOnly
		v.pool.log.Info("tokenless connection is read-only: the volume has an rw attachment; connect with its token to write",
			"volume", v.name, "peer", peer)
	}
	a := &Attachment{v: v, id: "implicit-" + newUID()[:12], node: peer, mode: mode,
		seq: v.att.nextSeq, implicit: true, created: time.Now().UTC(), done: make(chan struct{})}
	v.att.nextSeq++
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
	info := AttachmentInfo{ID: a.id, Volume: v.name, Node: a.node, Mode: a.mode, Implicit: a.implicit,
		Writer: a.mode == ModeReadWrite && v.att.writer != "" && v.att.writer == a.group() && !a.fenced.Load(),
		Fenced: a.mode == ModeReadWrite && a.fenced.Load(), Conns: int(a.conns.Load()), CreatedAt: a.created}
	switch {
	case a.mode == ModeReadOnly, a.implicit && v.explicitRW.Load() > 0:
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
	return WriterInfo{Epoch: v.att.epoch, Writer: v.att.writer}
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
	next := v.att
	next.byID = maps.Clone(v.att.byID)
	delete(next.byID, id)
	if !a.implicit {
		if err := v.saveAttachments(&next, nil); err != nil {
			return err
		}
	}
	v.att = next
	if !a.implicit && a.mode == ModeReadWrite {
		v.explicitRW.Add(-1)
	}
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
	if a.ReadOnly() {
		return AttachmentInfo{}, invalid("attachment", id, "is read-only and cannot hold the writer role")
	}
	fence := map[string]bool{a.id: false}
	for _, o := range v.att.byID {
		if o.group() != a.group() && o.mode == ModeReadWrite {
			fence[o.id] = true
		}
	}
	if err := v.claimLocked(a, fence); err != nil {
		return AttachmentInfo{}, err
	}
	v.pool.log.Info("writer role transferred", "volume", v.name, "attachment", a.id, "epoch", v.att.epoch)
	return v.attachmentInfo(a), nil
}

// claimLocked (gate exclusive, amu held) makes a's group the writer with a
// new epoch and applies fence, persisting first.
func (v *Volume) claimLocked(a *Attachment, fence map[string]bool) error {
	next := v.att
	next.epoch++
	next.writer = a.group()
	next.writerSeq = a.seq
	if err := v.saveAttachments(&next, fence); err != nil {
		return err
	}
	v.att = next
	for id, f := range fence {
		if o := v.att.byID[id]; o != nil {
			o.fenced.Store(f)
		}
	}
	return nil
}

// errMustClaim says a write needs the writer role first.
var errMustClaim = errors.New("must claim the writer role")

// mayWrite (gate held shared) says whether a may write disk df now.
func (a *Attachment) mayWrite(df *diskFile) error {
	if a == nil {
		return nil // an internal handle
	}
	if a.mode == ModeReadOnly {
		return fmt.Errorf("attachment %s is read-only: %w", a.id, ErrReadOnly)
	}
	if a.detached.Load() {
		return fmt.Errorf("attachment %s was detached: %w", a.id, ErrFenced)
	}
	if a.implicit && a.v.explicitRW.Load() > 0 {
		return a.implicitReadOnlyError()
	}
	if df.shared {
		return nil
	}
	if a.fenced.Load() {
		return a.fencedError()
	}
	if a.v.att.writer == a.group() {
		return nil
	}
	return errMustClaim
}

// implicitReadOnlyError refuses a tokenless connection's write while the
// volume has an explicit rw attachment.
func (a *Attachment) implicitReadOnlyError() error {
	return fmt.Errorf("volume %q has an rw attachment, so connections without its token are read-only "+
		"(connect with the attachment's token: quiver attach list %s): %w", a.v.name, a.v.name, ErrReadOnly)
}

func (a *Attachment) fencedError() error {
	return fmt.Errorf("attachment %s of volume %q: %w", a.id, a.v.name, ErrFenced)
}

// claim takes the gate exclusively and makes a the writer if it is newer
// than the current writer's claim; otherwise fences it.
func (a *Attachment) claim() error {
	v := a.v
	v.gate.Lock()
	defer v.gate.Unlock()
	v.amu.Lock()
	defer v.amu.Unlock()
	switch {
	case a.detached.Load():
		return fmt.Errorf("attachment %s was detached: %w", a.id, ErrFenced)
	case a.implicit && v.explicitRW.Load() > 0:
		return a.implicitReadOnlyError()
	case a.fenced.Load():
		return a.fencedError()
	case v.att.writer == a.group():
		return nil // another connection of the group claimed meanwhile
	case v.att.writer != "" && a.seq < v.att.writerSeq:
		if err := v.saveAttachments(&v.att, map[string]bool{a.id: true}); err != nil {
			return err
		}
		a.fenced.Store(true)
		return a.fencedError()
	}
	fence := map[string]bool{}
	for _, o := range v.att.byID {
		if o.group() != a.group() && o.seq < a.seq && o.mode == ModeReadWrite {
			fence[o.id] = true
		}
	}
	old := v.att.writer
	if err := v.claimLocked(a, fence); err != nil {
		return err
	}
	v.pool.log.Info("writer role claimed", "volume", v.name, "attachment", a.id, "node", a.node,
		"epoch", v.att.epoch, "previous", old, "fenced", len(fence))
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
	v.explicitRW.Store(0)
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
