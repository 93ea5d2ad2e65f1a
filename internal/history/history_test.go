package history

import (
	"errors"
	"testing"
)

func block(disk uint32, off int64, v Value) []byte {
	b := make([]byte, BlockSize)
	if v != (Value{}) {
		Stamp(b, disk, off, v)
	}
	return b
}

func TestStampParse(t *testing.T) {
	v := Value{Writer: 3, Seq: 77}
	b := block(1, 8192, v)
	if got, err := Parse(b, 1, 8192); err != nil || got != v {
		t.Fatalf("Parse: %v, %v; want %v", got, err, v)
	}
	if got, err := Parse(make([]byte, BlockSize), 1, 8192); err != nil || got != (Value{}) {
		t.Fatalf("Parse of zeros: %v, %v", got, err)
	}
	if _, err := Parse(b, 1, 4096); !errors.Is(err, ErrMisplaced) {
		t.Errorf("another offset: %v, want ErrMisplaced", err)
	}
	if _, err := Parse(b, 2, 8192); !errors.Is(err, ErrMisplaced) {
		t.Errorf("another disk: %v, want ErrMisplaced", err)
	}
	torn := block(1, 8192, v)
	copy(torn[BlockSize/2:], block(1, 8192, Value{3, 78})[BlockSize/2:])
	if _, err := Parse(torn, 1, 8192); !errors.Is(err, ErrTorn) {
		t.Errorf("half of another write: %v, want ErrTorn", err)
	}
	garbage := make([]byte, BlockSize)
	garbage[100] = 1
	if _, err := Parse(garbage, 1, 8192); !errors.Is(err, ErrGarbage) {
		t.Errorf("a stray byte: %v, want ErrGarbage", err)
	}
}

// TestCheck: one block's history, then what each content is judged.
func TestCheck(t *testing.T) {
	const disk, off = 0, 4 * BlockSize
	b := Block{disk, off}
	w := func(seq uint64) Value { return Value{Writer: 1, Seq: seq} }
	zeros := Value{}
	type step func(t *testing.T, l *Log, pending map[uint64]Write)
	invoke := func(seq, handle uint64) step {
		return func(t *testing.T, l *Log, p map[uint64]Write) {
			x, err := l.InvokeWrite(b, w(seq), handle)
			if err != nil {
				t.Fatal(err)
			}
			p[seq] = x
		}
	}
	ack := func(seq uint64) step { return func(t *testing.T, l *Log, p map[uint64]Write) { p[seq].Ack() } }
	fail := func(seq uint64) step {
		return func(t *testing.T, l *Log, p map[uint64]Write) { p[seq].Fail(errors.New("EIO")) }
	}
	write := func(seq uint64) step { // sent and acknowledged on handle 1
		return func(t *testing.T, l *Log, p map[uint64]Write) { invoke(seq, 1)(t, l, p); ack(seq)(t, l, p) }
	}
	flush := func(handle uint64) step {
		return func(t *testing.T, l *Log, p map[uint64]Write) { l.InvokeFlush(disk, handle).Ack() }
	}
	for _, tc := range []struct {
		name  string
		steps []step
		want  map[Value]Kind // "" for allowed
	}{
		{"never written", nil, map[Value]Kind{zeros: ""}},
		{"in flight", []step{invoke(1, 1)}, map[Value]Kind{zeros: "", w(1): "", w(2): NeverWritten}},
		{"acknowledged", []step{write(1)}, map[Value]Kind{zeros: LostAcked, w(1): ""}},
		{"acknowledged and flushed", []step{write(1), flush(1)}, map[Value]Kind{zeros: LostDurable, w(1): ""}},
		{"flushed, then acknowledged", []step{write(1), flush(1), write(2)},
			map[Value]Kind{zeros: LostDurable, w(1): LostAcked, w(2): ""}},
		{"acknowledged twice, flushed", []step{write(1), write(2), flush(1)},
			map[Value]Kind{zeros: LostDurable, w(1): LostDurable, w(2): ""}},
		{"acknowledged, then in flight", []step{write(1), flush(1), invoke(2, 1)},
			map[Value]Kind{zeros: LostDurable, w(1): "", w(2): ""}},
		{"in flight across the next write", []step{invoke(1, 1), invoke(2, 1), ack(2)},
			map[Value]Kind{zeros: LostAcked, w(1): "", w(2): ""}},
		{"failed, then acknowledged", []step{invoke(1, 1), fail(1), write(2)},
			map[Value]Kind{w(1): LostAcked, w(2): ""}},
		{"failed last", []step{write(1), invoke(2, 1), fail(2)}, map[Value]Kind{w(1): "", w(2): ""}},
		{"flushed on another handle", []step{write(1), flush(2)}, map[Value]Kind{zeros: LostAcked, w(1): ""}},
		{"flush sent before the acknowledgement", []step{invoke(1, 1),
			func(t *testing.T, l *Log, p map[uint64]Write) {
				f := l.InvokeFlush(disk, 1)
				p[1].Ack()
				f.Ack()
			}}, map[Value]Kind{zeros: LostAcked, w(1): ""}},
		{"flush failed", []step{write(1), func(t *testing.T, l *Log, p map[uint64]Write) { l.InvokeFlush(disk, 1).Fail() }},
			map[Value]Kind{zeros: LostAcked}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLog()
			p := map[uint64]Write{}
			for _, s := range tc.steps {
				s(t, l, p)
			}
			for v, want := range tc.want {
				got := l.Check(b, block(disk, off, v))
				switch {
				case want == "" && got != nil:
					t.Errorf("%v: %v, want allowed", v, got)
				case want != "" && got == nil:
					t.Errorf("%v: allowed, want %q", v, want)
				case want != "" && got.Kind != want:
					t.Errorf("%v: %v, want %q", v, got, want)
				}
				if got != nil {
					t.Logf("%v: %v", v, got)
				}
			}
		})
	}
}

func TestCheckContent(t *testing.T) {
	l := NewLog()
	b := Block{0, 0}
	x, err := l.InvokeWrite(b, Value{1, 1}, 1)
	if err != nil {
		t.Fatal(err)
	}
	x.Ack()
	if v := l.Check(b, block(0, BlockSize, Value{1, 1})); v == nil || v.Kind != Misplaced {
		t.Errorf("another block's write: %v", v)
	}
	if v := l.Check(Block{0, BlockSize}, block(0, BlockSize, Value{2, 1})); v == nil || v.Kind != NeverWritten {
		t.Errorf("a write in a block never written: %v", v)
	}
	torn := block(0, 0, Value{1, 1})
	torn[BlockSize-1] ^= 1
	if v := l.Check(b, torn); v == nil || v.Kind != Torn {
		t.Errorf("a torn block: %v", v)
	}
	image := make([]byte, 4*BlockSize)
	copy(image, block(0, 0, Value{1, 1}))
	if vs := l.CheckImage(0, image); len(vs) != 0 {
		t.Errorf("a good image: %v", vs)
	}
	copy(image[2*BlockSize:], block(0, 0, Value{1, 1}))
	if vs := l.CheckImage(0, image); len(vs) != 1 || vs[0].Block.Off != 2*BlockSize || vs[0].Kind != Misplaced {
		t.Errorf("a write landed in another block: %v", vs)
	}
}

func TestInvokeRefused(t *testing.T) {
	l := NewLog()
	b := Block{0, 0}
	if _, err := l.InvokeWrite(b, Value{1, 5}, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := l.InvokeWrite(b, Value{2, 6}, 1); err == nil {
		t.Error("a second writer of the block was accepted")
	}
	if _, err := l.InvokeWrite(b, Value{1, 5}, 1); err == nil {
		t.Error("a sequence number that does not grow was accepted")
	}
	if _, err := l.InvokeWrite(Block{0, 100}, Value{1, 7}, 1); err == nil {
		t.Error("an unaligned block was accepted")
	}
}
