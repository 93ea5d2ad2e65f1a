package replica

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quiverstorage/quiver/internal/pool"
)

// Replication sessions (docs/cluster.md, "Replication sessions"). A primary
// writes a copy only over a session: one NBD connection whose export name
// carries a Credential, signed with the cluster's replication key, that
// names the primary, its term and the session's epoch. The copy node
// checks the signature, that the primary and term are the volume's now,
// and that the session is newer than every other it has seen for the
// disk; the new session then fences every older one on that disk
// (Sessions): a request of an older session, even one already read from
// its connection and queued, is refused, never applied.

// Credential opens one replication session on one copy of one disk.
// Instance is the copy node's process instance the credential is for (a
// credential seen once opens nothing after the copy's node restarts);
// Epoch orders the sessions of one term (NewEpoch).
type Credential struct {
	Volume, Disk  string
	Primary, Copy string
	Instance      string
	Term, Epoch   uint64
	mac           []byte // as read (ParseCredential)
}

// credentialPrefix starts the token part of a session's export name.
const credentialPrefix = "repl1."

// IsCredential says whether the token part of an export name is a
// replication credential (and not an attachment's token).
func IsCredential(token string) bool { return strings.HasPrefix(token, credentialPrefix) }

func (c Credential) sum(key []byte) []byte {
	m := hmac.New(sha256.New, key)
	for _, f := range []string{"quiver replication session v1", c.Volume, c.Disk, c.Primary, c.Copy, c.Instance,
		strconv.FormatUint(c.Term, 10), strconv.FormatUint(c.Epoch, 10)} {
		m.Write([]byte(f))
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}

// Export is the export name that opens the session: <volume>/<disk>/repl1.
// <primary>.<term>.<epoch>.<signature>. The copy and its instance are not
// on the wire; the copy node fills in its own when it checks.
func (c Credential) Export(key []byte) string {
	return c.Volume + "/" + c.Disk + "/" + credentialPrefix + c.Primary + "." + strconv.FormatUint(c.Term, 10) + "." +
		strconv.FormatUint(c.Epoch, 10) + "." + base64.RawURLEncoding.EncodeToString(c.sum(key))
}

// ParseCredential reads the credential of export <volume>/<disk>/<token>;
// the copy node then fills in Copy and Instance (its own) and calls Verify.
func ParseCredential(volume, disk, token string) (Credential, error) {
	rest, ok := strings.CutPrefix(token, credentialPrefix)
	parts := strings.Split(rest, ".")
	if !ok || len(parts) != 4 || parts[0] == "" {
		return Credential{}, fmt.Errorf("%w: malformed", ErrSessionRefused)
	}
	term, err1 := strconv.ParseUint(parts[1], 10, 64)
	epoch, err2 := strconv.ParseUint(parts[2], 10, 64)
	mac, err3 := base64.RawURLEncoding.DecodeString(parts[3])
	if err1 != nil || err2 != nil || err3 != nil || term == 0 || epoch == 0 {
		return Credential{}, fmt.Errorf("%w: malformed", ErrSessionRefused)
	}
	return Credential{Volume: volume, Disk: disk, Primary: parts[0], Term: term, Epoch: epoch, mac: mac}, nil
}

// Verify checks the signature against key, in constant time.
func (c Credential) Verify(key []byte) error {
	if len(c.mac) == 0 || len(key) == 0 || !hmac.Equal(c.mac, c.sum(key)) {
		return fmt.Errorf("%w: the credential is not signed by a node of this cluster for this copy", ErrSessionRefused)
	}
	return nil
}

// epochs numbers the sessions this process opens: increasing, and above
// any number an earlier process of this node used (it starts at the wall
// clock in nanoseconds).
var epochs atomic.Uint64

// NewEpoch returns a new session epoch, larger than every earlier one of
// this node.
func NewEpoch() uint64 {
	for {
		last := epochs.Load()
		next := max(last+1, uint64(time.Now().UnixNano()))
		if epochs.CompareAndSwap(last, next) {
			return next
		}
	}
}

// Sessions is the copy node's side: for each disk of a copy, the newest
// session its primary opened. Its methods are safe for concurrent use.
type Sessions struct {
	mu sync.Mutex
	m  map[string]*sessionGate
}

// sessionGate orders one disk's sessions: a request holds it shared while
// it checks its session and runs; a new session takes it exclusively, so
// every request of an older session either ran before the new session
// began or is refused.
type sessionGate struct {
	rw          sync.RWMutex
	term, epoch uint64
}

// NewSessions returns an empty table.
func NewSessions() *Sessions { return &Sessions{m: map[string]*sessionGate{}} }

// Begin opens the session of cred on its disk of the local copy copyUID,
// fencing every older one; a session that is not newer (an older or equal
// term and epoch: a replay, or a request from a primary's older connection)
// is refused (ErrSessionRefused). Sessions are ordered per local copy: a
// volume deleted and made again under its name starts again at term 1.
func (t *Sessions) Begin(copyUID string, cred Credential) (*Session, error) {
	key := copyUID + "/" + cred.Disk
	t.mu.Lock()
	g := t.m[key]
	if g == nil {
		g = &sessionGate{}
		t.m[key] = g
	}
	t.mu.Unlock()
	g.rw.Lock() // waits for the requests in flight of the older session
	defer g.rw.Unlock()
	if cred.Term < g.term || (cred.Term == g.term && cred.Epoch <= g.epoch) {
		return nil, fmt.Errorf("%w: session %d of term %d is not newer than session %d of term %d on %s",
			ErrSessionRefused, cred.Epoch, cred.Term, g.epoch, g.term, key)
	}
	g.term, g.epoch = cred.Term, cred.Epoch
	return &Session{g: g, term: cred.Term, epoch: cred.Epoch}, nil
}

// Session is one open replication session on a copy's disk.
type Session struct {
	g           *sessionGate
	term, epoch uint64
}

// do runs fn if s is still its disk's newest session, holding the disk's
// gate shared so that no newer session begins meanwhile.
func (s *Session) do(fn func() error) error {
	s.g.rw.RLock()
	defer s.g.rw.RUnlock()
	if s.g.term != s.term || s.g.epoch != s.epoch {
		return fmt.Errorf("%w: session %d of term %d was replaced by session %d of term %d",
			ErrSessionFenced, s.epoch, s.term, s.g.epoch, s.g.term)
	}
	return fn()
}

// Disk returns the copy's disk handle for this session: every request
// runs only while the session is its disk's newest.
func (s *Session) Disk(d pool.Disk) pool.Disk { return &sessionDisk{d: d, s: s} }

// sessionDisk implements every method of pool.Disk itself: none reaches
// the copy's disk without the session's check.
type sessionDisk struct {
	d pool.Disk
	s *Session
}

var _ pool.Disk = (*sessionDisk)(nil)

func (d *sessionDisk) Size() int64    { return d.d.Size() }
func (d *sessionDisk) ReadOnly() bool { return d.d.ReadOnly() }
func (d *sessionDisk) ReadAt(p []byte, off int64) error {
	return d.s.do(func() error { return d.d.ReadAt(p, off) })
}
func (d *sessionDisk) WriteAt(p []byte, off int64, fua bool) error {
	return d.s.do(func() error { return d.d.WriteAt(p, off, fua) })
}
func (d *sessionDisk) Flush() error { return d.s.do(d.d.Flush) }
func (d *sessionDisk) Trim(off, length int64, fua bool) error {
	return d.s.do(func() error { return d.d.Trim(off, length, fua) })
}
func (d *sessionDisk) Zero(off, length int64, flags pool.ZeroFlags) error {
	return d.s.do(func() error { return d.d.Zero(off, length, flags) })
}
func (d *sessionDisk) Cache(off, length int64) error {
	return d.s.do(func() error { return d.d.Cache(off, length) })
}
func (d *sessionDisk) Extents(off, length int64, limit int) (out []pool.Extent, err error) {
	err = d.s.do(func() error {
		out, err = d.d.Extents(off, length, limit)
		return err
	})
	return out, err
}
func (d *sessionDisk) Close() error { return d.d.Close() }

// Capabilities offers none: each of them would reach the copy's disk past
// the session's check.
func (d *sessionDisk) Capabilities() pool.Capabilities { return pool.Capabilities{} }
