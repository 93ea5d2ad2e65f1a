//go:build amd64 && !purego

package crypt

import "golang.org/x/sys/cpu"

// haveAsm: the CPU runs xts_amd64.s, which needs AES-NI and AVX (VEX
// encodings, whose memory operands need no alignment).
var haveAsm = cpu.X86.HasAES && cpu.X86.HasAVX

// xtsEncryptUnit encrypts one data unit of blocks AES blocks (a multiple of
// 8) in place at buf with the schedules of the data key (k1) and the tweak
// key (k2); n is the data unit's number, its tweak.
//
//go:noescape
func xtsEncryptUnit(k1, k2 *roundKeys, buf *byte, blocks int, n uint64)

// xtsDecryptUnit is xtsEncryptUnit's inverse; k1 is the data key's
// decryption schedule, k2 still the tweak key's encryption schedule.
//
//go:noescape
func xtsDecryptUnit(k1, k2 *roundKeys, buf *byte, blocks int, n uint64)

// cryptAsm is crypt with xts_amd64.s, one call per data unit; unit must be
// a multiple of 128 bytes, eight AES blocks.
func (c *Cipher) cryptAsm(buf []byte, unit int, n uint64, encrypt bool) {
	for u := 0; u < len(buf); u += unit {
		if encrypt {
			xtsEncryptUnit(&c.fast.enc1, &c.fast.enc2, &buf[u], unit/aesBlock, n)
		} else {
			xtsDecryptUnit(&c.fast.dec1, &c.fast.enc2, &buf[u], unit/aesBlock, n)
		}
		n++
	}
}
