//go:build amd64 && !purego

package crypt

import "golang.org/x/sys/cpu"

// haveAsm: the CPU runs xts_amd64.s, which needs AES-NI and AVX (VEX
// encodings, whose memory operands need no alignment).
var haveAsm = cpu.X86.HasAES && cpu.X86.HasAVX

// haveVAES: the CPU also has VAES and VPCLMULQDQ on YMM registers (AVX2 and
// bits 9 and 10 of CPUID leaf 7's ECX, which golang.org/x/sys/cpu reports
// only with AVX-512), for the wide variant: two AES blocks per instruction,
// the tweaks advanced by carry-less multiplication.
var haveVAES = haveAsm && cpu.X86.HasAVX2 && cpuid7ecx()&(1<<9|1<<10) == 1<<9|1<<10

func cpuid7ecx() uint32

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

// xtsEncryptUnitVAES and xtsDecryptUnitVAES are the same with VAES on YMM
// registers; blocks must be a multiple of 16.
//
//go:noescape
func xtsEncryptUnitVAES(k1, k2 *roundKeys, buf *byte, blocks int, n uint64)

//go:noescape
func xtsDecryptUnitVAES(k1, k2 *roundKeys, buf *byte, blocks int, n uint64)

// cryptAsm is crypt with xts_amd64.s, one call per data unit; unit must be
// a multiple of 128 bytes, eight AES blocks (256 for the wide variant, else
// the narrow one runs).
func (c *Cipher) cryptAsm(buf []byte, unit int, n uint64, encrypt bool) {
	k := c.fast
	wide := k.wide && unit%(16*aesBlock) == 0
	for u := 0; u < len(buf); u += unit {
		switch {
		case wide && encrypt:
			xtsEncryptUnitVAES(&k.enc1, &k.enc2, &buf[u], unit/aesBlock, n)
		case wide:
			xtsDecryptUnitVAES(&k.dec1, &k.enc2, &buf[u], unit/aesBlock, n)
		case encrypt:
			xtsEncryptUnit(&k.enc1, &k.enc2, &buf[u], unit/aesBlock, n)
		default:
			xtsDecryptUnit(&k.dec1, &k.enc2, &buf[u], unit/aesBlock, n)
		}
		n++
	}
}
