package crypt

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/subtle"
	"encoding/binary"
	"fmt"
	"sync"
)

// BlockSize is the unit of encryption: every 4 KiB block of a disk is one
// XTS data unit whose tweak is its block number (byte offset / BlockSize).
const BlockSize = 4096

// aesBlock is AES's block size, XTS's cipher block.
const aesBlock = aes.BlockSize

// Cipher encrypts and decrypts the blocks of one disk with XTS-AES-256
// (IEEE 1619, NIST SP 800-38E): data unit = one 4 KiB block, tweak = its
// block number as a 128-bit little-endian integer. A data unit is a whole
// number of AES blocks, so no ciphertext stealing is ever needed. Every disk
// of a VM may share the data key: the tweak is the block number within a
// disk, so identical blocks at the same offset of two disks encrypt alike,
// as under dm-crypt with one key; disks are told apart by their files.
//
// It is safe for concurrent use and allocates nothing per call in steady
// state. On amd64 with AES-NI and AVX it runs xts_amd64.s, which keeps eight
// AES blocks in flight and computes the tweaks as it goes, several times
// faster than one crypto/aes call per 16-byte block (docs/benchmarks.md).
// Elsewhere it computes the 256 tweaks of a block first and XORs them over
// the block in one pass each side of the crypto/aes calls, where
// golang.org/x/crypto/xts works one 16-byte block at a time, slower still.
// The tests check both paths against that package, OpenSSL's XTS, the IEEE
// 1619 vectors and each other.
type Cipher struct {
	k1, k2 cipher.Block // data key's first half encrypts the data, second half the tweak
	fast   *asmKeys     // the assembly path's key schedules; nil: no such path here
}

// asmKeys are the key schedules xts_amd64.s reads: the data key's both ways,
// the tweak key's encryption one; wide: run its VAES variant.
type asmKeys struct {
	enc1, dec1, enc2 roundKeys
	wide             bool
}

// tweaks holds the tweaks of one data unit, one buffer per call in flight.
var tweaks = sync.Pool{New: func() any { return new([BlockSize]byte) }}

// NewCipher makes the cipher of a data key: XTS-AES-256, whose 64 bytes are
// the data key's (the first 32 encrypt the data, the last 32 the tweak),
// on the fastest of its paths that passed the self-test (selftest.go);
// ErrSelfTest when none did.
func NewCipher(key *DataKey) (*Cipher, error) {
	im := selected()
	if im.err != nil {
		return nil, im.err
	}
	k1, k2, err := newBlocks(key.b[:])
	if err != nil {
		return nil, err
	}
	c := &Cipher{k1: k1, k2: k2}
	if im.asm() {
		c.fast = &asmKeys{wide: im.wide()}
		c.fast.enc1, c.fast.dec1 = expandKey256(key.b[:32])
		c.fast.enc2, _ = expandKey256(key.b[32:])
	}
	return c, nil
}

// newBlocks makes XTS-AES-256's two AES ciphers of a 64-byte key (the first
// 32 bytes encrypt the data, the last 32 the tweak).
func newBlocks(key []byte) (k1, k2 cipher.Block, err error) {
	if k1, err = aes.NewCipher(key[:32]); err != nil {
		return nil, nil, fmt.Errorf("xts-aes-256: %w", err)
	}
	if k2, err = aes.NewCipher(key[32:]); err != nil {
		return nil, nil, fmt.Errorf("xts-aes-256: %w", err)
	}
	return k1, k2, nil
}

// EncryptAt encrypts buf in place as the blocks at byte offset off of the
// disk. off and len(buf) must be multiples of BlockSize; else it returns an
// error matching ErrUnaligned and leaves buf alone.
func (c *Cipher) EncryptAt(buf []byte, off int64) error {
	if err := aligned(buf, off); err != nil {
		return fmt.Errorf("encrypt: %w", err)
	}
	c.crypt(buf, BlockSize, uint64(off)/BlockSize, true)
	return nil
}

// DecryptAt decrypts buf in place as the blocks at byte offset off of the
// disk, under the same rules as EncryptAt.
func (c *Cipher) DecryptAt(buf []byte, off int64) error {
	if err := aligned(buf, off); err != nil {
		return fmt.Errorf("decrypt: %w", err)
	}
	c.crypt(buf, BlockSize, uint64(off)/BlockSize, false)
	return nil
}

// crypt runs XTS over the data units of buf, of size unit (BlockSize; the
// IEEE 1619 vectors have 512-byte ones), the first numbered n: for each
// 16-byte block P_j with tweak T_j, C_j = AES(P_j XOR T_j) XOR T_j (or the
// inverse cipher for decryption).
func (c *Cipher) crypt(buf []byte, unit int, n uint64, encrypt bool) {
	if c.fast != nil && unit%(8*aesBlock) == 0 {
		c.cryptAsm(buf, unit, n, encrypt)
		return
	}
	twp := tweaks.Get().(*[BlockSize]byte)
	defer tweaks.Put(twp)
	tw := twp[:unit]
	for u := 0; u < len(buf); u += unit {
		data := buf[u : u+unit]
		c.tweaksOf(tw, n)
		subtle.XORBytes(data, data, tw)
		if encrypt { // two loops: a call through a func value slows the hot path
			for j := 0; j < unit; j += aesBlock {
				c.k1.Encrypt(data[j:j+aesBlock], data[j:j+aesBlock])
			}
		} else {
			for j := 0; j < unit; j += aesBlock {
				c.k1.Decrypt(data[j:j+aesBlock], data[j:j+aesBlock])
			}
		}
		subtle.XORBytes(data, data, tw)
		n++
	}
}

// tweaksOf fills tw with the tweaks of data unit n: T_0 = AES_k2(n), and
// T_j+1 = T_j times x in GF(2^128) modulo x^128 + x^7 + x^2 + x + 1, the
// 128-bit values little-endian (IEEE 1619, section 5.2).
func (c *Cipher) tweaksOf(tw []byte, n uint64) {
	binary.LittleEndian.PutUint64(tw[0:8], n)
	binary.LittleEndian.PutUint64(tw[8:16], 0)
	c.k2.Encrypt(tw[:aesBlock], tw[:aesBlock])
	lo, hi := binary.LittleEndian.Uint64(tw[0:8]), binary.LittleEndian.Uint64(tw[8:16])
	for j := aesBlock; j < len(tw); j += aesBlock {
		carry := hi >> 63
		hi = hi<<1 | lo>>63
		lo = lo<<1 ^ carry*0x87
		binary.LittleEndian.PutUint64(tw[j:j+8], lo)
		binary.LittleEndian.PutUint64(tw[j+8:j+16], hi)
	}
}

func aligned(buf []byte, off int64) error {
	switch {
	case off < 0 || off%BlockSize != 0:
		return fmt.Errorf("offset %d: %w", off, ErrUnaligned)
	case len(buf)%BlockSize != 0:
		return fmt.Errorf("length %d: %w", len(buf), ErrUnaligned)
	}
	return nil
}
