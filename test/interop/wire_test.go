package interop

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"
)

// A minimal NBD client (fixed newstyle, NBD_OPT_GO, simple replies) for what
// no real peer does: send a write to a read-only export. Every real client
// checks NBD_FLAG_READ_ONLY itself and never asks, but the specification
// ("Transmission flags") says the server MUST error such writes. Written
// from the NBD protocol specification (doc/proto.md).
const (
	nbdMagic          = 0x4e42444d41474943 // "NBDMAGIC"
	nbdIHaveOpt       = 0x49484156454f5054 // "IHAVEOPT"
	nbdOptReplyMagic  = 0x3e889045565a9
	nbdRequestMagic   = 0x25609513
	nbdSimpleReply    = 0x67446698
	nbdOptGo          = 7
	nbdRepAck         = 1
	nbdRepInfo        = 3
	nbdInfoExport     = 0
	nbdFlagReadOnly   = 1 << 1
	nbdCmdWrite       = 1
	nbdCmdDisc        = 2
	nbdCmdFlush       = 3
	nbdCmdTrim        = 4
	nbdCmdWriteZeroes = 6
	nbdEPERM          = 1
)

type wireConn struct {
	nc     net.Conn
	size   uint64
	flags  uint16
	cookie uint64
}

// dialExport connects to addr and enters the transmission phase on export
// with NBD_OPT_GO.
func dialExport(t *testing.T, addr, export string) *wireConn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(30 * time.Second))
	w := &wireConn{nc: nc}

	var hello [18]byte
	w.read(t, hello[:])
	if binary.BigEndian.Uint64(hello[0:]) != nbdMagic || binary.BigEndian.Uint64(hello[8:]) != nbdIHaveOpt {
		t.Fatalf("not a newstyle NBD server: % x", hello)
	}
	hflags := binary.BigEndian.Uint16(hello[16:])
	if hflags&1 == 0 {
		t.Fatalf("handshake flags %#x: no NBD_FLAG_FIXED_NEWSTYLE", hflags)
	}
	w.write(t, binary.BigEndian.AppendUint32(nil, uint32(hflags&3))) // fixed newstyle, no zeroes if offered

	opt := binary.BigEndian.AppendUint64(nil, nbdIHaveOpt)
	opt = binary.BigEndian.AppendUint32(opt, nbdOptGo)
	opt = binary.BigEndian.AppendUint32(opt, uint32(4+len(export)+2))
	opt = binary.BigEndian.AppendUint32(opt, uint32(len(export)))
	opt = append(opt, export...)
	opt = binary.BigEndian.AppendUint16(opt, 0) // no information requests
	w.write(t, opt)
	for {
		var h [20]byte
		w.read(t, h[:])
		if binary.BigEndian.Uint64(h[0:]) != nbdOptReplyMagic || binary.BigEndian.Uint32(h[8:]) != nbdOptGo {
			t.Fatalf("bad option reply header % x", h)
		}
		typ, n := binary.BigEndian.Uint32(h[12:]), binary.BigEndian.Uint32(h[16:])
		if n > 64<<10 {
			t.Fatalf("option reply of %d bytes", n)
		}
		data := make([]byte, n)
		w.read(t, data)
		switch {
		case typ&(1<<31) != 0:
			t.Fatalf("NBD_OPT_GO %q: error %#x: %s", export, typ, data)
		case typ == nbdRepInfo && len(data) == 12 && binary.BigEndian.Uint16(data) == nbdInfoExport:
			w.size = binary.BigEndian.Uint64(data[2:])
			w.flags = binary.BigEndian.Uint16(data[10:])
		case typ == nbdRepAck:
			return w
		}
	}
}

// request sends one request other than READ and returns the error value of
// its simple reply.
func (w *wireConn) request(t *testing.T, typ uint16, off uint64, length uint32, payload []byte) uint32 {
	t.Helper()
	w.cookie++
	h := binary.BigEndian.AppendUint32(nil, nbdRequestMagic)
	h = binary.BigEndian.AppendUint16(h, 0) // command flags
	h = binary.BigEndian.AppendUint16(h, typ)
	h = binary.BigEndian.AppendUint64(h, w.cookie)
	h = binary.BigEndian.AppendUint64(h, off)
	h = binary.BigEndian.AppendUint32(h, length)
	w.write(t, append(h, payload...))
	var r [16]byte
	w.read(t, r[:])
	if binary.BigEndian.Uint32(r[0:]) != nbdSimpleReply {
		t.Fatalf("reply magic %#x, want a simple reply", binary.BigEndian.Uint32(r[0:]))
	}
	if c := binary.BigEndian.Uint64(r[8:]); c != w.cookie {
		t.Fatalf("reply cookie %d, want %d", c, w.cookie)
	}
	return binary.BigEndian.Uint32(r[4:])
}

// disconnect sends NBD_CMD_DISC and waits for the server to close.
func (w *wireConn) disconnect(t *testing.T) {
	t.Helper()
	h := binary.BigEndian.AppendUint32(nil, nbdRequestMagic)
	h = binary.BigEndian.AppendUint16(h, 0)
	h = binary.BigEndian.AppendUint16(h, nbdCmdDisc)
	h = append(h, make([]byte, 20)...)
	w.write(t, h)
	if n, err := w.nc.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("after NBD_CMD_DISC: read %d bytes, %v; want the server to close", n, err)
	}
}

func (w *wireConn) read(t *testing.T, p []byte) {
	t.Helper()
	if _, err := io.ReadFull(w.nc, p); err != nil {
		t.Fatalf("nbd read: %v", err)
	}
}

func (w *wireConn) write(t *testing.T, p []byte) {
	t.Helper()
	if _, err := w.nc.Write(p); err != nil {
		t.Fatalf("nbd write: %v", err)
	}
}
