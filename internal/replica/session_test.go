package replica

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/pool"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

// parsed is what a copy node with key makes of the export name of c,
// signed with testKey: parsed, with its own node and instance filled in.
func parsed(t *testing.T, c Credential, key []byte, copyNode, instance string) (Credential, error) {
	t.Helper()
	name := c.Export(testKey)
	parts := strings.SplitN(name, "/", 3)
	if len(parts) != 3 || parts[0] != c.Volume || parts[1] != c.Disk || !IsCredential(parts[2]) {
		t.Fatalf("export name %q", name)
	}
	p, err := ParseCredential(parts[0], parts[1], parts[2])
	if err != nil {
		return p, err
	}
	p.Copy, p.Instance = copyNode, instance
	return p, p.Verify(key)
}

// TestCredential: a credential verifies only for the copy node and
// instance it was signed for, with the cluster's key, unchanged.
func TestCredential(t *testing.T) {
	c := Credential{Volume: "web01", Disk: "root", Primary: "n1", Copy: "n2", Instance: "i-2", Term: 3, Epoch: NewEpoch()}
	got, err := parsed(t, c, testKey, "n2", "i-2")
	if err != nil || got.Primary != "n1" || got.Term != 3 || got.Epoch != c.Epoch {
		t.Fatalf("a good credential: %+v, %v", got, err)
	}
	for name, tc := range map[string]struct {
		key            []byte
		copy, instance string
	}{
		"another key":             {key: []byte("another key of 32 bytes, exactly"), copy: "n2", instance: "i-2"},
		"another copy node":       {key: testKey, copy: "n3", instance: "i-2"},
		"the copy node restarted": {key: testKey, copy: "n2", instance: "i-2b"},
		"no key":                  {key: nil, copy: "n2", instance: "i-2"},
	} {
		if _, err := parsed(t, c, tc.key, tc.copy, tc.instance); !errors.Is(err, ErrSessionRefused) {
			t.Errorf("%s: %v, want ErrSessionRefused", name, err)
		}
	}
	// The term, epoch or primary changed on the wire: the signature fails.
	name := c.Export(testKey)
	tok := strings.SplitN(name, "/", 3)[2]
	for _, bad := range []string{
		strings.Replace(tok, ".3.", ".4.", 1),
		strings.Replace(tok, "repl1.n1.", "repl1.n9.", 1),
		tok[:len(tok)-2] + "AA",
	} {
		p, err := ParseCredential("web01", "root", bad)
		if err == nil {
			p.Copy, p.Instance = "n2", "i-2"
			err = p.Verify(testKey)
		}
		if !errors.Is(err, ErrSessionRefused) {
			t.Errorf("altered %q: %v, want ErrSessionRefused", bad, err)
		}
	}
	// Another disk or volume, with the same token.
	for _, vd := range [][2]string{{"web02", "root"}, {"web01", "data"}} {
		p, err := ParseCredential(vd[0], vd[1], tok)
		if err == nil {
			p.Copy, p.Instance = "n2", "i-2"
			err = p.Verify(testKey)
		}
		if !errors.Is(err, ErrSessionRefused) {
			t.Errorf("token of web01/root used on %s/%s: %v", vd[0], vd[1], err)
		}
	}
	for _, bad := range []string{"", "repl1.", "repl1.n1.3.4", "repl1.n1.x.4.AAAA", "repl1.n1.0.4.AAAA", "repl1.n1.3.0.AAAA",
		"repl1..3.4.AAAA", "repl1.n1.3.4.!!", "token-of-an-attachment"} {
		if _, err := ParseCredential("web01", "root", bad); !errors.Is(err, ErrSessionRefused) {
			t.Errorf("malformed %q: %v", bad, err)
		}
	}
}

// TestNewEpochIncreases: every epoch is larger than the one before, from
// any goroutine.
func TestNewEpochIncreases(t *testing.T) {
	var mu sync.Mutex
	seen := map[uint64]bool{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := uint64(0)
			for range 1000 {
				e := NewEpoch()
				if e <= last {
					t.Errorf("epoch %d after %d", e, last)
				}
				last = e
				mu.Lock()
				if seen[e] {
					t.Errorf("epoch %d twice", e)
				}
				seen[e] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
}

// recordingDisk is a pool.Disk in memory that can hold a write until told
// to go on (a request read from its connection and queued).
type recordingDisk struct {
	pool.Disk
	mu      sync.Mutex
	data    []byte
	entered chan struct{}
	release chan struct{}
}

func (d *recordingDisk) WriteAt(p []byte, off int64, fua bool) error {
	if d.entered != nil {
		d.entered <- struct{}{}
		<-d.release
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	copy(d.data[off:], p)
	return nil
}

func (d *recordingDisk) byteAt(off int64) byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.data[off]
}

// TestSessionsFenceOlder (issue 29, defect 3): a request of an older
// session that runs after a newer session of its disk began is refused,
// never applied, so a write still queued on a primary's dropped connection
// cannot land over what the primary re-copied on its new one; a request
// in flight when the newer session begins finishes before it. A session
// that is not newer than the newest (a replay, an older term) is refused.
func TestSessionsFenceOlder(t *testing.T) {
	tab := NewSessions()
	disk := &recordingDisk{data: make([]byte, 4096)}
	cred := func(term, epoch uint64) Credential {
		return Credential{Volume: "web01", Disk: "root", Primary: "n1", Term: term, Epoch: epoch}
	}
	old, err := tab.Begin("uid-1", cred(2, 10))
	if err != nil {
		t.Fatal(err)
	}
	oldDisk := old.Disk(disk)
	if err := oldDisk.WriteAt([]byte{1}, 0, false); err != nil || disk.byteAt(0) != 1 {
		t.Fatalf("write of the current session: %v", err)
	}

	// A request of the old session is in flight (past its check) when a
	// newer session begins: Begin waits for it.
	disk.entered, disk.release = make(chan struct{}), make(chan struct{})
	inflight := make(chan error, 1)
	go func() { inflight <- oldDisk.WriteAt([]byte{2}, 1, false) }()
	<-disk.entered
	began := make(chan *Session, 1)
	go func() {
		s, err := tab.Begin("uid-1", cred(2, 11))
		if err != nil {
			t.Error(err)
		}
		began <- s
	}()
	select {
	case <-began:
		t.Fatal("a newer session began while a request of the older one was being applied")
	case <-time.After(100 * time.Millisecond):
	}
	close(disk.release)
	if err := <-inflight; err != nil {
		t.Fatalf("the request in flight: %v", err)
	}
	newer := <-began
	disk.entered, disk.release = nil, nil

	// A request of the old session queued until now: refused, not applied.
	if err := oldDisk.WriteAt([]byte{3}, 2, false); !errors.Is(err, ErrSessionFenced) {
		t.Fatalf("a write of the fenced session: %v, want ErrSessionFenced", err)
	}
	if disk.byteAt(2) != 0 {
		t.Fatal("a write of the fenced session was applied")
	}
	for name, call := range map[string]func() error{
		"flush": oldDisk.Flush,
		"trim":  func() error { return oldDisk.Trim(0, 512, false) },
		"zero":  func() error { return oldDisk.Zero(0, 512, 0) },
		"read":  func() error { return oldDisk.ReadAt(make([]byte, 1), 0) },
		"cache": func() error { return oldDisk.Cache(0, 512) },
		"extents": func() error {
			_, err := oldDisk.Extents(0, 512, 0)
			return err
		},
	} {
		if err := call(); !errors.Is(err, ErrSessionFenced) {
			t.Errorf("%s of the fenced session: %v, want ErrSessionFenced", name, err)
		}
	}
	if err := newer.Disk(disk).WriteAt([]byte{4}, 3, false); err != nil || disk.byteAt(3) != 4 {
		t.Fatalf("write of the newer session: %v", err)
	}

	for name, c := range map[string]Credential{
		"a replay of the newest": cred(2, 11),
		"an older epoch":         cred(2, 9),
		"an older term":          cred(1, 99),
	} {
		if _, err := tab.Begin("uid-1", c); !errors.Is(err, ErrSessionRefused) {
			t.Errorf("%s: %v, want ErrSessionRefused", name, err)
		}
	}
	// A newer term fences the older term's session whatever its epoch.
	if _, err := tab.Begin("uid-1", cred(3, 1)); err != nil {
		t.Fatal(err)
	}
	if err := newer.Disk(disk).WriteAt([]byte{5}, 4, false); !errors.Is(err, ErrSessionFenced) {
		t.Fatalf("the older term's session after a newer term's began: %v", err)
	}
	// Sessions of another disk are not touched.
	if _, err := tab.Begin("uid-1", Credential{Volume: "web01", Disk: "data", Primary: "n1", Term: 2, Epoch: 1}); err != nil {
		t.Fatalf("another disk: %v", err)
	}
	// The volume deleted and made again under its name (another local
	// copy): its sessions start again at term 1.
	if _, err := tab.Begin("uid-2", cred(1, 1)); err != nil {
		t.Fatalf("a new copy of the same name at term 1: %v", err)
	}
}
