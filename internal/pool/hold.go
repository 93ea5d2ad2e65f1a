package pool

import "sync"

// Hold is a volume's control lock taken ahead of a long operation that runs
// later (in a job), so that a conflicting operation is refused with ErrBusy
// when the operation is asked for rather than when it starts. One
// operation runs under a Hold (Hold.CreateSnapshot, Hold.Rollback) and
// releases it; Release frees a Hold that no operation used.
type Hold struct {
	v       *Volume
	release func()
	once    sync.Once
}

// Hold takes the volume's control lock for op, or refuses with ErrBusy.
func (v *Volume) Hold(op string) (*Hold, error) {
	unlock, err := v.lockOps(op)
	if err != nil {
		return nil, err
	}
	return &Hold{v: v, release: unlock}, nil
}

// Release frees the control lock, unless the operation already did.
func (h *Hold) Release() { h.once.Do(h.release) }
