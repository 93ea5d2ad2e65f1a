package nbd

import (
	"math/bits"
	"sync"
)

// Payload buffers come from size-class pools (powers of two from 4 KiB to
// maxPayload) so the request path does not allocate.
const (
	minClassShift = 12 // 4 KiB
	maxClassShift = 25 // maxPayload, 32 MiB
)

var bufPools [maxClassShift - minClassShift + 1]sync.Pool

func classOf(n int) int {
	if n <= 1<<minClassShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minClassShift
}

// getBuf returns a buffer of length n (n <= maxPayload).
func getBuf(n int) *[]byte {
	c := classOf(n)
	if p, ok := bufPools[c].Get().(*[]byte); ok {
		*p = (*p)[:n]
		return p
	}
	b := make([]byte, n, 1<<(c+minClassShift))
	return &b
}

// putBuf returns a buffer from getBuf to its pool.
func putBuf(p *[]byte) {
	if p == nil {
		return
	}
	bufPools[classOf(cap(*p))].Put(p)
}
