package nbd

import (
	"math/bits"
	"sync"
)

// Payload buffers come from size classes (powers of two from 4 KiB to
// maxPayload) so the request path does not allocate. Classes up to
// syncPoolMaxShift live in sync.Pools, which the garbage collector empties;
// larger ones in bounded free lists of at most largeKeepBytes per class, the
// rest going to the garbage collector, so that a burst of 32 MiB requests
// does not stay pooled after its connections close (memory.go).
const (
	minClassShift    = 12 // 4 KiB
	maxClassShift    = 25 // maxPayload, 32 MiB
	syncPoolMaxShift = 21 // 2 MiB: a 1 MiB READ with its header room
	largeKeepBytes   = 16 << 20
)

var (
	bufPools  [syncPoolMaxShift - minClassShift + 1]sync.Pool
	largeBufs [maxClassShift - syncPoolMaxShift]chan *[]byte
)

func init() {
	for i := range largeBufs {
		size := 1 << (syncPoolMaxShift + 1 + i)
		largeBufs[i] = make(chan *[]byte, max(1, largeKeepBytes/size))
	}
}

func classOf(n int) int {
	if n <= 1<<minClassShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minClassShift
}

// getBuf returns a buffer of length n (n <= maxPayload).
func getBuf(n int) *[]byte {
	c := classOf(n)
	if c < len(bufPools) {
		if p, ok := bufPools[c].Get().(*[]byte); ok {
			*p = (*p)[:n]
			return p
		}
	} else {
		select {
		case p := <-largeBufs[c-len(bufPools)]:
			*p = (*p)[:n]
			return p
		default:
		}
	}
	b := make([]byte, n, 1<<(c+minClassShift))
	return &b
}

// putBuf returns a buffer from getBuf to its pool, or to the garbage
// collector when its bounded list is full.
func putBuf(p *[]byte) {
	if p == nil {
		return
	}
	c := classOf(cap(*p))
	if c < len(bufPools) {
		bufPools[c].Put(p)
		return
	}
	select {
	case largeBufs[c-len(bufPools)] <- p:
	default:
	}
}
