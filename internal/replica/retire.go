package replica

import (
	"errors"
	"sort"
)

// Retire ends the Set while the caller holds its gate (Freeze): every later
// change fails with ErrNotAcknowledged, before anything is applied locally
// or on a copy; the copies' connections close and the resyncs stop. A
// primary that hands its volume over to another copy freezes the Set,
// records the new primary in etcd, then retires it: no change is applied
// anywhere through this Set after the new primary's term began. Close
// later releases the bitmaps as usual.
func (s *Set) Retire() {
	s.mu.Lock()
	s.closed = true
	cs, rs := s.inSync, s.resync
	s.inSync, s.resync = map[string]*conn{}, map[string]*Resync{}
	s.mu.Unlock()
	for _, c := range cs {
		c.close()
	}
	for _, r := range rs {
		r.fail(errors.New("the primary handed the volume over"))
	}
}

// Nodes lists every copy the Set knows: written to (in sync or being
// resynced) or tracked out of sync by a bitmap.
func (s *Set) Nodes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[string]bool{}
	for n := range s.inSync {
		seen[n] = true
	}
	for n := range s.resync {
		seen[n] = true
	}
	for n := range s.bitmaps {
		seen[n] = true
	}
	out := make([]string, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Remove stops writing the copy on node and forgets its bitmap (the file
// too): the copy left the volume's placement (a drained node's). Nothing
// is marked for it from then on.
func (s *Set) Remove(node string) error {
	s.gate.Lock() // no change in flight writes or marks it
	defer s.gate.Unlock()
	s.mu.Lock()
	c, r, b := s.inSync[node], s.resync[node], s.bitmaps[node]
	delete(s.inSync, node)
	delete(s.resync, node)
	delete(s.bitmaps, node)
	s.mu.Unlock()
	if c != nil {
		c.close()
	}
	if r != nil {
		r.fail(errors.New("the copy left the placement"))
	}
	if b != nil {
		return b.Remove()
	}
	return nil
}
