package crypt

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"

	"golang.org/x/crypto/xts"
)

// TestSelfTestAnswer: the self-test's known answer is what
// golang.org/x/crypto/xts computes, and what the IEEE 1619 vectors check
// the Go path against (TestKnownAnswers); no path is trusted for it.
func TestSelfTestAnswer(t *testing.T) {
	x, err := xts.NewCipher(aes.NewCipher, katKey())
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, BlockSize)
	x.Encrypt(buf, katPlain(), katBlock)
	if sum := sha256.Sum256(buf); hex.EncodeToString(sum[:]) != katDigest {
		t.Fatalf("katDigest is %s, x/crypto/xts gives %x", katDigest, sum)
	}
}

// TestSelfTestOnThisMachine: every path of this CPU is offered to the
// self-test, and the one chosen is the first that passes. Under an
// emulator whose VAES is wrong (QEMU 7.2's TCG) "vaes" is refused and the
// rest of this package's tests run on the paths left.
func TestSelfTestOnThisMachine(t *testing.T) {
	name, refused, err := Implementation()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cipher path %q; refused: %q", name, refused)
	cs, err := candidates(katKey())
	if err != nil {
		t.Fatal(err)
	}
	var want string
	for _, c := range cs {
		if check(c.c) == nil {
			want = c.name
			break
		}
	}
	if name != want {
		t.Fatalf("chosen %q, want %q, the first candidate that passes", name, want)
	}
	if names := candidateNames(cs); !slices.Contains(names, "go") || (haveAsm && !slices.Contains(names, "aesni")) {
		t.Fatalf("candidates %q miss a path of this CPU", names)
	}
}

func candidateNames(cs []candidate) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.name)
	}
	return out
}

// TestSelfTestRefusesWrongPaths: a path that encrypts wrong (another key
// stands in for a faulty instruction), or encrypts right but decrypts
// wrong, is refused with why, the next one is taken; when none passes, no
// cipher is made.
func TestSelfTestRefusesWrongPaths(t *testing.T) {
	good, err := candidates(katKey())
	if err != nil {
		t.Fatal(err)
	}
	other := katKey()
	other[40] ^= 1 // the tweak key: the first AES block of a unit still right, as under the TCG fault
	bad, err := candidates(other)
	if err != nil {
		t.Fatal(err)
	}
	goPath := good[len(good)-1]
	badDecrypt := *goPath.c
	badDecrypt.k1 = wrongDecrypt{goPath.c.k1}

	im := choose([]candidate{{"vaes", bad[0].c}, {"aesni", &badDecrypt}, goPath})
	if im.err != nil || im.name != "go" || im.asm() {
		t.Fatalf("chose %+v, want the go path", im)
	}
	if len(im.refused) != 2 || !strings.Contains(im.refused[0], "vaes: encryption gives a wrong ciphertext") ||
		!strings.Contains(im.refused[1], "aesni: decryption does not give the plaintext back") {
		t.Fatalf("refused %q", im.refused)
	}

	im = choose([]candidate{{"go", bad[len(bad)-1].c}})
	if !errors.Is(im.err, ErrSelfTest) || im.name != "" {
		t.Fatalf("no path passes: %+v, want ErrSelfTest", im)
	}
}

// wrongDecrypt is an AES block cipher whose decryption is off by a bit.
type wrongDecrypt struct{ cipher.Block }

func (w wrongDecrypt) Decrypt(dst, src []byte) {
	w.Block.Decrypt(dst, src)
	dst[0] ^= 1
}
