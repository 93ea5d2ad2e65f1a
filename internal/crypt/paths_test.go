package crypt

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// agree encrypts plain at off with every path of key, checks that they all
// give the same ciphertext and decrypt it back, and returns the number of
// paths. buf's first byte is at skew bytes into a larger array, so that the
// assembly's unaligned loads and stores are exercised too.
func agree(t *testing.T, key, plain []byte, off int64, skew int) int {
	t.Helper()
	var want []byte
	ps := paths(t, key)
	for _, name := range []string{"go", "aesni", "vaes"} {
		c := ps[name]
		if c == nil {
			continue
		}
		buf := make([]byte, skew+len(plain)+16)[skew : skew+len(plain)]
		copy(buf, plain)
		if err := c.EncryptAt(buf, off); err != nil {
			t.Fatal(err)
		}
		if want == nil {
			want = bytes.Clone(buf)
		} else if !bytes.Equal(buf, want) {
			t.Fatalf("%s: %d bytes at %#x (buffer skew %d) encrypt differently from the go path", name, len(plain), off, skew)
		}
		if err := c.DecryptAt(buf, off); err != nil || !bytes.Equal(buf, plain) {
			t.Fatalf("%s: %d bytes at %#x: round trip: %v", name, len(plain), off, err)
		}
	}
	return len(ps)
}

// TestPathsAgree runs the assembly paths and the Go one over random keys,
// offsets (up to 2^51 blocks), lengths (up to 64 blocks) and buffer
// alignments, and compares them.
func TestPathsAgree(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 5))
	for range 300 {
		key := make([]byte, DataKeySize)
		for i := range key {
			key[i] = byte(r.Uint32())
		}
		plain := make([]byte, r.IntN(65)*BlockSize)
		for i := range plain {
			plain[i] = byte(r.Uint32())
		}
		off := int64(r.Uint64N(1<<51)) * BlockSize
		if n := agree(t, key, plain, off, r.IntN(16)); n < 2 {
			t.Skip("one path only on this machine")
		}
	}
}

// FuzzPathsAgree: any key, block number and content (repeated to fill up
// to four blocks) encrypt alike on every path and decrypt back.
func FuzzPathsAgree(f *testing.F) {
	f.Add(bytes.Repeat([]byte{1}, DataKeySize), uint64(0), []byte("x"), uint8(1), uint8(0))
	f.Add(bytes.Repeat([]byte{0xff}, DataKeySize), uint64(1<<51-1), []byte{0, 0x80}, uint8(4), uint8(7))
	f.Fuzz(func(t *testing.T, key []byte, blk uint64, pattern []byte, blocks, skew uint8) {
		key = append(bytes.Clone(key), make([]byte, DataKeySize)...)[:DataKeySize]
		plain := make([]byte, int(blocks%5)*BlockSize)
		if len(pattern) > 0 {
			for i := range plain {
				plain[i] = pattern[i%len(pattern)]
			}
		}
		agree(t, key, plain, int64(blk%(1<<51))*BlockSize, int(skew%16))
	})
}
