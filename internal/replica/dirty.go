package replica

import "sync"

// Dirty is the set of granules that changed while some copy was out of
// sync: what a resync must copy. It lives in memory; docs/cluster.md
// describes the write-ahead bitmap that is to make it survive a crash.
type Dirty struct {
	granule int64
	mu      sync.Mutex
	bits    []uint64
	count   int
}

func newDirty(size, granule int64) *Dirty {
	n := (size + granule - 1) / granule
	return &Dirty{granule: granule, bits: make([]uint64, (n+63)/64)}
}

func (d *Dirty) mark(off, length int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for g := off / d.granule; g*d.granule < off+length; g++ {
		if int(g/64) >= len(d.bits) {
			return
		}
		if w, b := &d.bits[g/64], uint64(1)<<(g%64); *w&b == 0 {
			*w |= b
			d.count++
		}
	}
}

// Granules returns the number of dirty granules and the granule size.
func (d *Dirty) Granules() (n int, granule int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.count, d.granule
}

// Ranges returns the dirty granules as byte ranges, in order.
func (d *Dirty) Ranges() [][2]int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out [][2]int64
	for g := int64(0); g < int64(len(d.bits))*64; g++ {
		if d.bits[g/64]&(uint64(1)<<(g%64)) != 0 {
			out = append(out, [2]int64{g * d.granule, d.granule})
		}
	}
	return out
}
