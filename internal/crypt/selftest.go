package crypt

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
)

// Self-test. A cipher that computes the wrong thing destroys every block it
// writes, silently: the ciphertext decrypts to garbage on any other machine,
// or on this one once the fault is gone. So, as the Linux crypto manager
// tests each implementation before it registers it, the cipher runs a known
// answer through each of its paths once per process, before the first data
// key is used, and takes the fastest path that gives it; one that does not
// is never used. Found where it matters: QEMU 7.2's TCG announces VAES
// under -cpu max and computes it wrong on YMM registers; the wide path then
// got the second AES block of every data unit wrong, and test/powercut's
// guests read their encrypted volumes back as garbage.

// ErrSelfTest: no implementation of the cipher gives the known answer on
// this machine; nothing is encrypted or decrypted.
var ErrSelfTest = errors.New("xts-aes-256 self-test failed")

// The known answer: katPlain as data unit katBlock under katKey, whose
// ciphertext has SHA-256 katDigest (the 256 tweaks of a 4 KiB unit run
// through the doubling's carries). TestSelfTestAnswer computes it with
// golang.org/x/crypto/xts.
const (
	katBlock  = 0x8000_0001_7fff_fffe
	katDigest = "2239289bf126b6f73178726db58ca2a9003f6da7ec243e8e069afbbbfe6d7fa2"
)

func katKey() []byte {
	k := make([]byte, DataKeySize)
	for i := range k {
		k[i] = byte(i*29 + 11)
	}
	return k
}

func katPlain() []byte {
	p := make([]byte, BlockSize)
	for i := range p {
		p[i] = byte(i*7 + i>>8)
	}
	return p
}

// candidate is one implementation of the cipher under the self-test's key.
type candidate struct {
	name string // "vaes", "aesni", "go"
	c    *Cipher
}

// candidates are this CPU's implementations for key, fastest first.
func candidates(key []byte) ([]candidate, error) {
	k1, k2, err := newBlocks(key)
	if err != nil {
		return nil, err
	}
	var cs []candidate
	if haveAsm {
		keys := &asmKeys{}
		keys.enc1, keys.dec1 = expandKey256(key[:32])
		keys.enc2, _ = expandKey256(key[32:])
		if haveVAES {
			wide := *keys
			wide.wide = true
			cs = append(cs, candidate{"vaes", &Cipher{k1: k1, k2: k2, fast: &wide}})
		}
		cs = append(cs, candidate{"aesni", &Cipher{k1: k1, k2: k2, fast: keys}})
	}
	return append(cs, candidate{"go", &Cipher{k1: k1, k2: k2}}), nil
}

// check runs the known answer through c: encryption must give katDigest and
// decryption the plaintext back.
func check(c *Cipher) error {
	plain := katPlain()
	buf := bytes.Clone(plain)
	c.crypt(buf, BlockSize, katBlock, true)
	if sum := sha256.Sum256(buf); hex.EncodeToString(sum[:]) != katDigest {
		return errors.New("encryption gives a wrong ciphertext")
	}
	c.crypt(buf, BlockSize, katBlock, false)
	if !bytes.Equal(buf, plain) {
		return errors.New("decryption does not give the plaintext back")
	}
	return nil
}

// implementation is the self-test's verdict for this process.
type implementation struct {
	name    string   // the path every Cipher takes: "vaes", "aesni" or "go" (candidates)
	refused []string // paths the CPU offers that failed, with why
	err     error    // no path passed (wraps ErrSelfTest)
}

// choose picks the first of cs that passes check.
func choose(cs []candidate) implementation {
	var im implementation
	for _, c := range cs {
		if err := check(c.c); err != nil {
			im.refused = append(im.refused, fmt.Sprintf("%s: %v", c.name, err))
			continue
		}
		im.name = c.name
		return im
	}
	im.err = fmt.Errorf("%w: every implementation on this machine gives wrong results (%v)", ErrSelfTest, im.refused)
	return im
}

// asm reports whether the path is one of xts_amd64.s's; wide, its VAES one.
func (im implementation) asm() bool  { return im.name == "vaes" || im.name == "aesni" }
func (im implementation) wide() bool { return im.name == "vaes" }

var selected = sync.OnceValue(func() implementation {
	cs, err := candidates(katKey())
	if err != nil {
		return implementation{err: fmt.Errorf("%w: %w", ErrSelfTest, err)}
	}
	return choose(cs)
})

// Implementation names the path the cipher takes in this process ("vaes",
// "aesni" or "go") after its self-test, and the paths the CPU offers that
// the self-test refused, each with why; err (wrapping ErrSelfTest) when none
// passed, and then NewCipher refuses every key.
func Implementation() (name string, refused []string, err error) {
	im := selected()
	return im.name, im.refused, im.err
}
