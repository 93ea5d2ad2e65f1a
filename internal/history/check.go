package history

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Kind says how a block's content breaks the history.
type Kind string

const (
	// LostDurable: the block holds a write older than its last durable
	// one (or zeros after it).
	LostDurable Kind = "lost a durable write"
	// LostAcked: the block holds a write older than its last acknowledged
	// one, which no FLUSH covered yet.
	LostAcked Kind = "lost an acknowledged write"
	// NeverWritten: a write of the block's writer that was never sent to
	// this block (newer than its last one), or content in a block that
	// nobody wrote.
	NeverWritten Kind = "holds a write never sent there"
	// Torn, Garbage, Misplaced: what Parse found (ErrTorn, ErrGarbage,
	// ErrMisplaced).
	Torn      Kind = "torn"
	Garbage   Kind = "garbage"
	Misplaced Kind = "another block's write"
)

// Violation is a block whose content no history allows.
type Violation struct {
	Block Block
	Kind  Kind
	Found Value
	Err   error // Parse's error, for Torn, Garbage and Misplaced
	// Want describes what the block may hold: its last acknowledged write
	// (and whether and when it was made durable) and the writes in flight
	// or failed after it.
	Want string
}

func (v Violation) String() string {
	found := v.Found.String()
	if v.Err != nil {
		found = v.Err.Error()
	}
	return fmt.Sprintf("%v: %s: found %s; want %s", v.Block, v.Kind, found, v.Want)
}

// Check compares one block's content, data (BlockSize bytes read at b),
// with the history: nil when a history allows it. Call it with no request
// of b in flight that is not in the log.
func (l *Log) Check(b Block, data []byte) *Violation {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.blocks[b]
	found, err := Parse(data, b.Disk, b.Off)
	viol := func(k Kind) *Violation {
		return &Violation{Block: b, Kind: k, Found: found, Err: err, Want: r.legal()}
	}
	switch {
	case errors.Is(err, ErrTorn):
		return viol(Torn)
	case errors.Is(err, ErrMisplaced):
		return viol(Misplaced)
	case err != nil:
		return viol(Garbage)
	case r == nil:
		if found == (Value{}) {
			return nil
		}
		return viol(NeverWritten)
	case found == (Value{}):
		if r.acked == nil {
			return nil
		}
	default:
		for _, w := range r.live {
			if w.v == found {
				return nil
			}
		}
		if found.Writer != r.owner || r.acked == nil || found.Seq > r.acked.v.Seq {
			return viol(NeverWritten)
		}
	}
	// Zeros or an older write of the owner.
	if r.durable != nil && found.Seq < r.durable.v.Seq {
		return viol(LostDurable)
	}
	return viol(LostAcked)
}

// legal describes what r allows.
func (r *register) legal() string {
	if r == nil {
		return "zeros (never written)"
	}
	var parts []string
	switch {
	case r.acked == nil:
		parts = append(parts, "zeros (no write acknowledged)")
	default:
		s := fmt.Sprintf("%v (last acknowledged, sent %s, answered %s", r.acked.v, stamp(r.acked.invokedAt), stamp(r.acked.doneAt))
		if r.durable == r.acked {
			s += fmt.Sprintf(", durable at %s", stamp(r.durable.durableAt))
		} else if r.durable != nil {
			s += fmt.Sprintf("; last durable: %v at %s", r.durable.v, stamp(r.durable.durableAt))
		}
		parts = append(parts, s+")")
	}
	for _, w := range r.live {
		if w == r.acked {
			continue
		}
		switch {
		case w.done == 0:
			parts = append(parts, fmt.Sprintf("%v (in flight since %s)", w.v, stamp(w.invokedAt)))
		case !w.acked:
			parts = append(parts, fmt.Sprintf("%v (failed at %s: %s)", w.v, stamp(w.doneAt), w.failReason))
		default:
			parts = append(parts, fmt.Sprintf("%v (acknowledged at %s)", w.v, stamp(w.doneAt)))
		}
	}
	return strings.Join(parts, " or ")
}

func stamp(t time.Time) string { return t.UTC().Format("15:04:05.000") }

// Blocks lists the blocks of disk that were ever written, by offset.
func (l *Log) Blocks(disk uint32) []Block {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Block
	for b := range l.blocks {
		if b.Disk == disk {
			out = append(out, b)
		}
	}
	slices.SortFunc(out, func(a, b Block) int { return int(a.Off - b.Off) })
	return out
}

// CheckImage checks every block of disk in image (the whole disk): the
// blocks ever written against their history, every other BlockSize-aligned
// block for zeros or a write that was never sent there.
func (l *Log) CheckImage(disk uint32, image []byte) []Violation {
	var out []Violation
	for off := int64(0); off+BlockSize <= int64(len(image)); off += BlockSize {
		if v := l.Check(Block{disk, off}, image[off:off+BlockSize]); v != nil {
			out = append(out, *v)
		}
	}
	return out
}

// Stats counts what the history holds.
type Stats struct {
	Blocks, Attempts, Acked, Durable int
}

// Stats returns the history's counts: blocks written, writes sent, blocks
// with an acknowledged write and with a durable one.
func (l *Log) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	var s Stats
	for _, r := range l.blocks {
		s.Blocks++
		s.Attempts += r.attempts
		if r.acked != nil {
			s.Acked++
		}
		if r.durable != nil {
			s.Durable++
		}
	}
	return s
}
