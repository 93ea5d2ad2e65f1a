package crypt

import "encoding/binary"

// AES-256's key schedule (FIPS 197, section 5.2), for the assembly path of
// the cipher, which needs the round keys themselves; crypto/aes keeps its
// own out of reach. The S-box is computed once from its definition
// (FIPS 197, section 5.1.1: the inverse in GF(2^8), then an affine map)
// rather than written out as a table.

// aesRounds is AES-256's number of rounds; a schedule has one more round key.
const aesRounds = 14

// roundKeys is a key schedule: round key r is the 16 bytes the r-th
// AddRoundKey XORs over the state, in the state's byte order (AES-NI's).
type roundKeys [aesRounds + 1][aesBlock]byte

var sbox = makeSbox()

// gfMul multiplies in GF(2^8) modulo x^8 + x^4 + x^3 + x + 1.
func gfMul(a, b byte) byte {
	var p byte
	for ; b != 0; b >>= 1 {
		if b&1 != 0 {
			p ^= a
		}
		hi := a & 0x80
		a <<= 1
		if hi != 0 {
			a ^= 0x1b
		}
	}
	return p
}

func makeSbox() (s [256]byte) {
	for x := range 256 {
		inv := byte(0) // 0 maps to 0; else x^254 = x^-1 (the group has order 255)
		if x != 0 {
			inv = 1
			for range 254 {
				inv = gfMul(inv, byte(x))
			}
		}
		rot := func(n uint) byte { return inv<<n | inv>>(8-n) }
		s[x] = inv ^ rot(1) ^ rot(2) ^ rot(3) ^ rot(4) ^ 0x63
	}
	return s
}

func subWord(w uint32) uint32 {
	return uint32(sbox[w>>24])<<24 | uint32(sbox[w>>16&0xff])<<16 | uint32(sbox[w>>8&0xff])<<8 | uint32(sbox[w&0xff])
}

// expandKey256 returns the encryption schedule of a 32-byte AES key and the
// decryption schedule of the equivalent inverse cipher (FIPS 197, section
// 5.3.5): the encryption round keys in reverse order, the inner ones passed
// through InvMixColumns, as AESDEC expects them.
func expandKey256(key []byte) (enc, dec roundKeys) {
	const nk = 8 // key words
	var w [4 * (aesRounds + 1)]uint32
	for i := range nk {
		w[i] = binary.BigEndian.Uint32(key[4*i:])
	}
	rcon := uint32(1)
	for i := nk; i < len(w); i++ {
		t := w[i-1]
		switch i % nk {
		case 0:
			t = subWord(t<<8|t>>24) ^ rcon<<24
			rcon = uint32(gfMul(byte(rcon), 2))
		case 4:
			t = subWord(t)
		}
		w[i] = w[i-nk] ^ t
	}
	for r := range enc {
		for c := range 4 {
			binary.BigEndian.PutUint32(enc[r][4*c:], w[4*r+c])
		}
	}
	dec[0], dec[aesRounds] = enc[aesRounds], enc[0]
	for r := 1; r < aesRounds; r++ {
		dec[r] = invMixColumns(enc[aesRounds-r])
	}
	return enc, dec
}

// invMixColumns applies AES's InvMixColumns to each 4-byte column of k.
func invMixColumns(k [aesBlock]byte) (out [aesBlock]byte) {
	for c := 0; c < aesBlock; c += 4 {
		a0, a1, a2, a3 := k[c], k[c+1], k[c+2], k[c+3]
		out[c] = gfMul(a0, 14) ^ gfMul(a1, 11) ^ gfMul(a2, 13) ^ gfMul(a3, 9)
		out[c+1] = gfMul(a0, 9) ^ gfMul(a1, 14) ^ gfMul(a2, 11) ^ gfMul(a3, 13)
		out[c+2] = gfMul(a0, 13) ^ gfMul(a1, 9) ^ gfMul(a2, 14) ^ gfMul(a3, 11)
		out[c+3] = gfMul(a0, 11) ^ gfMul(a1, 13) ^ gfMul(a2, 9) ^ gfMul(a3, 14)
	}
	return out
}
