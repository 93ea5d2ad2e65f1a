package replica

// Leave stops writing copy node through the Set, recording nothing: for a
// copy its caller has recorded diverged (an operation of the primary at the
// cut failed on it; cluster.Copies.MarkDiverged), whose resync copies it
// whole (MarkWhole), so no bitmap need track what it misses until then.
// Call it with the Set frozen (Freeze), so that no change is in flight.
func (s *Set) Leave(node string) {
	s.mu.Lock()
	c := s.inSync[node]
	delete(s.inSync, node)
	s.mu.Unlock()
	if c != nil {
		c.close()
	}
}
