package crypt

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/xts"
)

type xtsVector struct {
	name     string
	key      []byte
	dusn     uint64
	ptx, ctx []byte
}

// readVectors reads testdata/ieee1619-xts-aes256.txt.
func readVectors(t *testing.T) []xtsVector {
	t.Helper()
	f, err := os.Open("testdata/ieee1619-xts-aes256.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var vs []xtsVector
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		field, val, _ := strings.Cut(sc.Text(), " ")
		if field == "" || strings.HasPrefix(field, "#") {
			continue
		}
		if field == "vector" {
			vs = append(vs, xtsVector{name: val})
			continue
		}
		v := &vs[len(vs)-1]
		var err error
		switch field {
		case "key":
			v.key, err = hex.DecodeString(val)
		case "dusn":
			v.dusn, err = strconv.ParseUint(val, 16, 64)
		case "ptx":
			v.ptx, err = hex.DecodeString(val)
		case "ctx":
			v.ctx, err = hex.DecodeString(val)
		default:
			t.Fatalf("unknown field %q", field)
		}
		if err != nil {
			t.Fatalf("vector %s, %s: %v", v.name, field, err)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(vs) != 5 {
		t.Fatalf("%d vectors, want 5 (IEEE 1619 vectors 10 to 14)", len(vs))
	}
	return vs
}

func testCipher(t testing.TB, key []byte) *Cipher {
	t.Helper()
	k, err := DataKeyFrom(key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCipher(k)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// paths are the cipher's implementations for one key, to be run through the
// same test: "vaes" (xts_amd64.s on YMM registers) and "aesni" (the same on
// XMM registers), where the CPU has them and they pass the self-test, and
// "go" (crypto/aes and the tweaks in Go) always. On amd64 in CI the AES-NI
// path must be there, so that it cannot go untested by a CPU check gone
// wrong.
func paths(t testing.TB, key []byte) map[string]*Cipher {
	t.Helper()
	cs, err := candidates(key)
	if err != nil {
		t.Fatal(err)
	}
	kat, err := candidates(katKey())
	if err != nil {
		t.Fatal(err)
	}
	ps := map[string]*Cipher{}
	for i, c := range cs {
		if check(kat[i].c) == nil {
			ps[c.name] = c.c
		}
	}
	if ps["aesni"] == nil && runtime.GOARCH == "amd64" && os.Getenv("CI") != "" {
		t.Fatal("no AES-NI assembly path on amd64 in CI (no AES-NI or AVX, or its self-test failed?)")
	}
	return ps
}

// TestKnownAnswers runs the IEEE 1619 XTS-AES-256 vectors (512-byte data
// units) through the cipher a data key makes, both ways, and through
// golang.org/x/crypto/xts, the oracle of TestAgainstXCrypto.
func TestKnownAnswers(t *testing.T) {
	for _, v := range readVectors(t) {
		t.Run("vector"+v.name, func(t *testing.T) {
			buf := bytes.Clone(v.ptx)
			for name, c := range paths(t, v.key) {
				c.crypt(buf, len(buf), v.dusn, true)
				if !bytes.Equal(buf, v.ctx) {
					t.Fatalf("%s: ciphertext %x..., want %x...", name, buf[:16], v.ctx[:16])
				}
				c.crypt(buf, len(buf), v.dusn, false)
				if !bytes.Equal(buf, v.ptx) {
					t.Fatalf("%s: decrypted %x..., want %x...", name, buf[:16], v.ptx[:16])
				}
			}
			x, err := xts.NewCipher(aes.NewCipher, v.key)
			if err != nil {
				t.Fatal(err)
			}
			x.Encrypt(buf, buf, v.dusn)
			if !bytes.Equal(buf, v.ctx) {
				t.Fatal("x/crypto/xts disagrees with the vector")
			}
		})
	}
}

// TestBlockNumberIsTweak checks EncryptAt against another implementation
// (Python's cryptography, OpenSSL's XTS): each 4 KiB block at offset off is
// one data unit whose tweak is off/4096, little-endian.
func TestBlockNumberIsTweak(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err == nil {
		err = exec.Command(py, "-c", "import cryptography.hazmat.primitives.ciphers").Run()
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("python3 with cryptography (python3-cryptography) missing: %v", err)
		}
		t.Skipf("python3 with cryptography missing: %v", err)
	}
	key := make([]byte, DataKeySize)
	for i := range key {
		key[i] = byte(3*i + 1)
	}
	const off = 0x12345 * BlockSize
	plain := make([]byte, 3*BlockSize)
	for i := range plain {
		plain[i] = byte(i * 7)
	}
	script := `
import sys
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
key, off, data = bytes.fromhex(sys.argv[1]), int(sys.argv[2]), bytes.fromhex(sys.argv[3])
out = b""
for i in range(0, len(data), 4096):
    tweak = (off // 4096 + i // 4096).to_bytes(16, "little")
    e = Cipher(algorithms.AES(key), modes.XTS(tweak)).encryptor()
    out += e.update(data[i:i+4096]) + e.finalize()
print(out.hex())
`
	out, err := exec.Command(py, "-c", script, hex.EncodeToString(key), strconv.Itoa(off), hex.EncodeToString(plain)).Output()
	if err != nil {
		t.Fatal(err)
	}
	want, err := hex.DecodeString(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range paths(t, key) {
		buf := bytes.Clone(plain)
		if err := c.EncryptAt(buf, off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, want) {
			t.Fatalf("%s: EncryptAt at %#x differs from OpenSSL's XTS with the block number as tweak", name, off)
		}
		if err := c.DecryptAt(buf, off); err != nil || !bytes.Equal(buf, plain) {
			t.Fatalf("%s: DecryptAt: %v, round trip equal %v", name, err, bytes.Equal(buf, plain))
		}
	}
}

// TestAgainstXCrypto compares EncryptAt and DecryptAt with
// golang.org/x/crypto/xts over 4 KiB data units at many offsets and keys.
func TestAgainstXCrypto(t *testing.T) {
	for k := range 4 {
		key := make([]byte, DataKeySize)
		for i := range key {
			key[i] = byte(i*k + 31*k + 1)
		}
		x, err := xts.NewCipher(aes.NewCipher, key)
		if err != nil {
			t.Fatal(err)
		}
		for name, c := range paths(t, key) {
			for _, blk := range []int64{0, 1, 255, 256, 1 << 20, 1<<32 - 1, 1 << 40, 1<<63/BlockSize - 2} {
				plain := make([]byte, 2*BlockSize)
				for i := range plain {
					plain[i] = byte(i*k + int(blk))
				}
				got := bytes.Clone(plain)
				if err := c.EncryptAt(got, blk*BlockSize); err != nil {
					t.Fatal(err)
				}
				want := bytes.Clone(plain)
				x.Encrypt(want[:BlockSize], want[:BlockSize], uint64(blk))
				x.Encrypt(want[BlockSize:], want[BlockSize:], uint64(blk+1))
				if !bytes.Equal(got, want) {
					t.Fatalf("%s: key %d, block %d: differs from x/crypto/xts", name, k, blk)
				}
				if err := c.DecryptAt(got, blk*BlockSize); err != nil || !bytes.Equal(got, plain) {
					t.Fatalf("%s: key %d, block %d: round trip: %v", name, k, blk, err)
				}
			}
		}
	}
}

func TestUnaligned(t *testing.T) {
	c := testCipher(t, make([]byte, DataKeySize))
	for _, tc := range []struct {
		name string
		len  int
		off  int64
	}{
		{"short buffer", 512, 0},
		{"odd length", BlockSize + 1, 0},
		{"odd offset", BlockSize, 512},
		{"negative offset", BlockSize, -BlockSize},
	} {
		t.Run(tc.name, func(t *testing.T) {
			buf := make([]byte, tc.len)
			if err := c.EncryptAt(buf, tc.off); !errors.Is(err, ErrUnaligned) {
				t.Errorf("EncryptAt: %v, want ErrUnaligned", err)
			}
			if err := c.DecryptAt(buf, tc.off); !errors.Is(err, ErrUnaligned) {
				t.Errorf("DecryptAt: %v, want ErrUnaligned", err)
			}
			if !bytes.Equal(buf, make([]byte, tc.len)) {
				t.Error("a refused call changed the buffer")
			}
		})
	}
}

// TestBlocksDiffer: the same plaintext at two block numbers gives two
// ciphertexts, and an empty buffer is no error.
func TestBlocksDiffer(t *testing.T) {
	c := testCipher(t, bytes.Repeat([]byte{7, 9}, DataKeySize/2))
	a, b := make([]byte, BlockSize), make([]byte, BlockSize)
	if err := c.EncryptAt(a, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.EncryptAt(b, BlockSize); err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(a, b) {
		t.Fatal("blocks 0 and 1 of zeros encrypt the same")
	}
	if err := c.EncryptAt(nil, 0); err != nil {
		t.Fatal(err)
	}
}

func TestNoAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool allocate")
	}
	for name, c := range paths(t, bytes.Repeat([]byte{1}, DataKeySize)) {
		buf := make([]byte, 16*BlockSize)
		allocs := testing.AllocsPerRun(100, func() {
			if err := c.EncryptAt(buf, 8*BlockSize); err != nil {
				t.Fatal(err)
			}
			if err := c.DecryptAt(buf, 8*BlockSize); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Fatalf("%s: %v allocations per encrypt and decrypt, want 0", name, allocs)
		}
	}
}

// TestConcurrent uses one cipher from many goroutines (run with -race).
func TestConcurrent(t *testing.T) {
	c := testCipher(t, bytes.Repeat([]byte{5}, DataKeySize))
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			plain := bytes.Repeat([]byte{byte(g)}, 4*BlockSize)
			buf := bytes.Clone(plain)
			for i := range 50 {
				off := int64(i*4+g) * BlockSize
				if err := c.EncryptAt(buf, off); err != nil {
					t.Error(err)
					return
				}
				if err := c.DecryptAt(buf, off); err != nil || !bytes.Equal(buf, plain) {
					t.Errorf("goroutine %d round %d: %v", g, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// cpuTime is the process's CPU time (user and system) so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchmarkCipher reports MB/s of wall time and, as MB/cpu-s, of the CPU
// time the process spent: the throughput of one core even on a machine that
// others share (the benchmark runs on one goroutine).
func benchmarkCipher(b *testing.B, size int, decrypt bool, path string) {
	key := bytes.Repeat([]byte{0x5a}, DataKeySize)
	c := testCipher(b, key)
	if path != "" {
		if c = paths(b, key)[path]; c == nil {
			b.Skipf("no %s path on this machine", path)
		}
	}
	buf := make([]byte, size)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	cpu0 := cpuTime(b)
	n := 0
	for b.Loop() {
		off := int64(n%1024) * int64(size)
		n++
		var err error
		if decrypt {
			err = c.DecryptAt(buf, off)
		} else {
			err = c.EncryptAt(buf, off)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	if cpu := cpuTime(b) - cpu0; cpu > 0 {
		b.ReportMetric(float64(n)*float64(size)/cpu.Seconds()/1e6, "MB/cpu-s")
	}
}

// The benchmarks run on one goroutine: MB/s is per core. Encrypt and
// Decrypt run the path NewCipher picks (here: the fastest); the suffixes
// force the AES-NI path on XMM registers and the Go fallback, side by side.
func BenchmarkEncrypt4K(b *testing.B)      { benchmarkCipher(b, BlockSize, false, "") }
func BenchmarkEncrypt1M(b *testing.B)      { benchmarkCipher(b, 1<<20, false, "") }
func BenchmarkDecrypt4K(b *testing.B)      { benchmarkCipher(b, BlockSize, true, "") }
func BenchmarkDecrypt1M(b *testing.B)      { benchmarkCipher(b, 1<<20, true, "") }
func BenchmarkEncrypt4KAESNI(b *testing.B) { benchmarkCipher(b, BlockSize, false, "aesni") }
func BenchmarkDecrypt4KAESNI(b *testing.B) { benchmarkCipher(b, BlockSize, true, "aesni") }
func BenchmarkDecrypt1MAESNI(b *testing.B) { benchmarkCipher(b, 1<<20, true, "aesni") }
func BenchmarkEncrypt4KGo(b *testing.B)    { benchmarkCipher(b, BlockSize, false, "go") }
func BenchmarkDecrypt4KGo(b *testing.B)    { benchmarkCipher(b, BlockSize, true, "go") }
func BenchmarkDecrypt1MGo(b *testing.B)    { benchmarkCipher(b, 1<<20, true, "go") }

// BenchmarkXCryptoEncrypt1M is golang.org/x/crypto/xts over the same 1 MiB
// in 4 KiB data units, side by side with BenchmarkEncrypt1M.
func BenchmarkXCryptoEncrypt1M(b *testing.B) {
	x, err := xts.NewCipher(aes.NewCipher, bytes.Repeat([]byte{0x5a}, DataKeySize))
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	b.SetBytes(int64(len(buf)))
	cpu0 := cpuTime(b)
	n := 0
	for b.Loop() {
		for i := 0; i < len(buf); i += BlockSize {
			x.Encrypt(buf[i:i+BlockSize], buf[i:i+BlockSize], uint64(n*256+i/BlockSize))
		}
		n++
	}
	if cpu := cpuTime(b) - cpu0; cpu > 0 {
		b.ReportMetric(float64(n)*float64(len(buf))/cpu.Seconds()/1e6, "MB/cpu-s")
	}
}
