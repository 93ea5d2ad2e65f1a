package storage

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestTrySendTo: a cached range goes to the socket after the head, byte for
// byte, at any offset; an evicted range, or one past the end of the file,
// is refused with ErrWouldBlock and nothing sent.
func TestTrySendTo(t *testing.T) {
	dir := t.TempDir()
	data := make([]byte, 3<<20)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	if err := os.WriteFile(filepath.Join(dir, "img"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	fsys, err := OpenOS(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	f, err := fsys.OpenRegular("img", os.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s, ok := f.(Sender)
	if !ok {
		t.Fatal("a file of the operating system is not a Sender")
	}

	// send runs TrySendTo into a unix stream socket pair, reading the other
	// end meanwhile (the ranges exceed the socket buffer), and returns what
	// was sent, what arrived and the error.
	send := func(head []byte, off int64, n int) (int, []byte, error) {
		t.Helper()
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		rd := os.NewFile(uintptr(fds[1]), "peer")
		defer rd.Close()
		got := make(chan []byte, 1)
		go func() {
			b, _ := io.ReadAll(rd)
			got <- b
		}()
		sent, err := s.TrySendTo(fds[0], head, off, n)
		_ = unix.Close(fds[0])
		return sent, <-got, err
	}

	head := []byte("reply header")
	for _, c := range []struct {
		off int64
		n   int
	}{{0, 1 << 20}, {1000, 300000}, {4096, 2<<20 + 1}, {int64(len(data)) - 5000, 5000}} {
		sent, got, err := send(head, c.off, c.n)
		if err != nil || sent != len(head)+c.n {
			t.Fatalf("[%d, +%d): sent %d, %v; want %d, nil", c.off, c.n, sent, err, len(head)+c.n)
		}
		if want := append(bytes.Clone(head), data[c.off:c.off+int64(c.n)]...); !bytes.Equal(got, want) {
			t.Fatalf("[%d, +%d): the peer got other bytes than head and range", c.off, c.n)
		}
	}

	// Past the end of the file: those pages are in no cache.
	if sent, got, err := send(head, int64(len(data))-4096, 8192); !errors.Is(err, ErrWouldBlock) || sent != 0 || len(got) != 0 {
		t.Fatalf("range past the end: sent %d (%d arrived), %v; want 0, ErrWouldBlock", sent, len(got), err)
	}
	// Evicted (written back first: dirty pages stay).
	fd := int(f.(*osFile).fd)
	if err := unix.Fdatasync(fd); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fadvise(fd, 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	if sent, got, err := send(head, 1<<20, 1<<20); !errors.Is(err, ErrWouldBlock) || sent != 0 || len(got) != 0 {
		t.Fatalf("evicted range: sent %d (%d arrived), %v; want 0, ErrWouldBlock", sent, len(got), err)
	}
}

// TestTrySendToAllocations: TrySendTo allocates nothing (it runs for every
// large READ).
func TestTrySendToAllocations(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "img"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	fsys, err := OpenOS(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer fsys.Close()
	f, err := fsys.OpenRegular("img", os.O_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[1])
	const n = 256 << 10
	head := make([]byte, 32)
	// The peer drains the socket into one buffer until it is closed.
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		buf := make([]byte, 64<<10)
		for {
			if m, err := unix.Read(fds[1], buf); m <= 0 || err != nil {
				return
			}
		}
	}()
	s := f.(Sender)
	allocs := testing.AllocsPerRun(20, func() {
		if sent, err := s.TrySendTo(fds[0], head, 0, n); err != nil || sent != len(head)+n {
			t.Fatalf("sent %d, %v", sent, err)
		}
	})
	_ = unix.Close(fds[0])
	<-drained
	if allocs != 0 {
		t.Fatalf("%.1f allocations per TrySendTo, want 0", allocs)
	}
}
