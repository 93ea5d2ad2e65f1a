package record

import (
	"errors"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	buf := make([]byte, Size)
	for _, c := range []struct{ seq, disk uint64 }{{0, 0}, {1, 0}, {0, 1}, {12345, 1}, {1<<63 + 7, 0}} {
		Encode(buf, c.seq, c.disk)
		seq, disk, err := Decode(buf)
		if err != nil || seq != c.seq || disk != c.disk {
			t.Errorf("Decode(Encode(%d, %d)) = %d, %d, %v", c.seq, c.disk, seq, disk, err)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	good := make([]byte, Size)
	Encode(good, 42, 1)
	other := make([]byte, Size)
	Encode(other, 43, 1)
	cases := []struct {
		name   string
		mutate func(b []byte)
		want   error
	}{
		{"zeros", func(b []byte) { clear(b) }, ErrEmpty},
		{"magic", func(b []byte) { b[0] ^= 1 }, ErrCorrupt},
		{"seq", func(b []byte) { b[seqOff] ^= 1 }, ErrCorrupt},
		{"filler", func(b []byte) { b[2000] ^= 0x80 }, ErrCorrupt},
		{"checksum", func(b []byte) { b[crcOff] ^= 1 }, ErrCorrupt},
		{"trailer", func(b []byte) { b[Size-1] = 1 }, ErrCorrupt},
		// The first half of one record and the second half of the next:
		// a torn write of the checksum's sector.
		{"torn", func(b []byte) { copy(b[Size/2:], other[Size/2:]) }, ErrCorrupt},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := append([]byte(nil), good...)
			c.mutate(b)
			if _, _, err := Decode(b); !errors.Is(err, c.want) {
				t.Errorf("Decode: %v, want %v", err, c.want)
			}
		})
	}
}

func TestCount(t *testing.T) {
	const slots = 8
	image := func(disk uint64, seqs ...int64) []byte {
		img := make([]byte, slots*Size)
		for slot, seq := range seqs {
			if seq >= 0 {
				Encode(img[slot*Size:(slot+1)*Size], uint64(seq), disk)
			}
		}
		return img
	}
	cases := []struct {
		name    string
		img     []byte
		disk    uint64
		want    int64
		wantErr bool
	}{
		{"empty", image(0), 0, 0, false},
		{"three", image(0, 0, 1, 2), 0, 3, false},
		{"full", image(1, 0, 1, 2, 3, 4, 5, 6, 7), 1, 8, false},
		{"other disk", image(1, 0, 1, 2), 0, 0, true},
		{"out of order", image(0, 0, 2, 1), 0, 0, true},
		{"gap", image(0, 0, 1, -1, 3), 0, 0, true},
		{"stale record beyond the end", image(0, 0, 1, -1, -1, -1, 5), 0, 0, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n, err := Count(c.img, c.disk)
			if (err != nil) != c.wantErr || n != c.want {
				t.Errorf("Count = %d, %v; want %d, error %v", n, err, c.want, c.wantErr)
			}
		})
	}
	img := image(0, 0, 1, 2)
	img[Size+100] ^= 1
	if _, err := Count(img, 0); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Count of a corrupt slot: %v, want ErrCorrupt", err)
	}
}
