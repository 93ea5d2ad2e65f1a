package powercut

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// nbdClient is a minimal NBD client (NetworkBlockDevice/nbd doc/proto.md):
// fixed newstyle negotiation with NBD_OPT_GO, simple replies, one request
// at a time. One request at a time keeps the model simple: when the power
// is cut at most one request is in flight, and every reply received was
// sent before the cut.
type nbdClient struct {
	c      net.Conn
	size   int64
	cookie uint64
}

const (
	nbdMagic        = 0x4e42444d41474943 // "NBDMAGIC"
	nbdOptMagic     = 0x49484156454f5054 // "IHAVEOPT"
	nbdRepMagic     = 0x3e889045565a9
	nbdRequestMagic = 0x25609513
	nbdSimpleReply  = 0x67446698

	nbdFlagFixedNewstyle = 1
	nbdFlagNoZeroes      = 2
	nbdOptGo             = 7
	nbdRepAck            = 1
	nbdRepInfo           = 3
	nbdInfoExport        = 0

	nbdCmdRead    = 0
	nbdCmdWrite   = 1
	nbdCmdDisc    = 2
	nbdCmdFlush   = 3
	nbdCmdFlagFUA = 1
)

// ioTimeout bounds each exchange: a guest under TCG on a loaded machine is
// slow, but never this slow.
const ioTimeout = 60 * time.Second

func dialNBD(addr, export string) (*nbdClient, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	cl := &nbdClient{c: c}
	if err := cl.negotiate(export); err != nil {
		c.Close()
		return nil, fmt.Errorf("nbd negotiation for %s: %w", redact(export), err)
	}
	return cl, nil
}

func (cl *nbdClient) negotiate(export string) error {
	_ = cl.c.SetDeadline(time.Now().Add(ioTimeout))
	defer cl.c.SetDeadline(time.Time{})
	var hello [18]byte
	if _, err := io.ReadFull(cl.c, hello[:]); err != nil {
		return err
	}
	if binary.BigEndian.Uint64(hello[0:]) != nbdMagic || binary.BigEndian.Uint64(hello[8:]) != nbdOptMagic {
		return fmt.Errorf("not a newstyle NBD server: % x", hello)
	}
	if binary.BigEndian.Uint16(hello[16:])&nbdFlagFixedNewstyle == 0 {
		return errors.New("server is not fixed newstyle")
	}
	opt := binary.BigEndian.AppendUint32(nil, nbdFlagFixedNewstyle|nbdFlagNoZeroes)
	opt = binary.BigEndian.AppendUint64(opt, nbdOptMagic)
	opt = binary.BigEndian.AppendUint32(opt, nbdOptGo)
	opt = binary.BigEndian.AppendUint32(opt, uint32(4+len(export)+2))
	opt = binary.BigEndian.AppendUint32(opt, uint32(len(export)))
	opt = append(opt, export...)
	opt = binary.BigEndian.AppendUint16(opt, 0) // no information requests
	if _, err := cl.c.Write(opt); err != nil {
		return err
	}
	for {
		var hdr [20]byte
		if _, err := io.ReadFull(cl.c, hdr[:]); err != nil {
			return err
		}
		if binary.BigEndian.Uint64(hdr[0:]) != nbdRepMagic {
			return fmt.Errorf("bad option reply magic % x", hdr[:8])
		}
		typ, n := binary.BigEndian.Uint32(hdr[12:]), binary.BigEndian.Uint32(hdr[16:])
		if n > 1<<20 {
			return fmt.Errorf("option reply of %d bytes", n)
		}
		data := make([]byte, n)
		if _, err := io.ReadFull(cl.c, data); err != nil {
			return err
		}
		switch {
		case typ == nbdRepAck:
			if cl.size == 0 {
				return errors.New("NBD_OPT_GO acknowledged without the export's size")
			}
			return nil
		case typ == nbdRepInfo && len(data) >= 12 && binary.BigEndian.Uint16(data) == nbdInfoExport:
			cl.size = int64(binary.BigEndian.Uint64(data[2:]))
		case typ&(1<<31) != 0:
			return fmt.Errorf("refused (reply type %#x): %s", typ, data)
		}
	}
}

// do sends one request and waits for its reply; a READ's data lands in buf.
func (cl *nbdClient) do(cmd, flags uint16, off int64, payload, buf []byte) error {
	cl.cookie++
	n := len(payload)
	if cmd == nbdCmdRead {
		n = len(buf)
	}
	req := binary.BigEndian.AppendUint32(make([]byte, 0, 28+len(payload)), nbdRequestMagic)
	req = binary.BigEndian.AppendUint16(req, flags)
	req = binary.BigEndian.AppendUint16(req, cmd)
	req = binary.BigEndian.AppendUint64(req, cl.cookie)
	req = binary.BigEndian.AppendUint64(req, uint64(off))
	req = binary.BigEndian.AppendUint32(req, uint32(n))
	req = append(req, payload...)
	_ = cl.c.SetDeadline(time.Now().Add(ioTimeout))
	if _, err := cl.c.Write(req); err != nil {
		return err
	}
	var rep [16]byte
	if _, err := io.ReadFull(cl.c, rep[:]); err != nil {
		return err
	}
	if binary.BigEndian.Uint32(rep[0:]) != nbdSimpleReply || binary.BigEndian.Uint64(rep[8:]) != cl.cookie {
		return fmt.Errorf("bad reply % x", rep)
	}
	if e := binary.BigEndian.Uint32(rep[4:]); e != 0 {
		return fmt.Errorf("NBD error %d", e)
	}
	if cmd == nbdCmdRead {
		if _, err := io.ReadFull(cl.c, buf); err != nil {
			return err
		}
	}
	return nil
}

func (cl *nbdClient) write(p []byte, off int64, fua bool) error {
	var flags uint16
	if fua {
		flags = nbdCmdFlagFUA
	}
	return cl.do(nbdCmdWrite, flags, off, p, nil)
}

func (cl *nbdClient) flush() error                   { return cl.do(nbdCmdFlush, 0, 0, nil, nil) }
func (cl *nbdClient) read(p []byte, off int64) error { return cl.do(nbdCmdRead, 0, off, nil, p) }

// close sends NBD_CMD_DISC (best effort) and closes the connection.
func (cl *nbdClient) close() {
	_ = cl.c.SetDeadline(time.Now().Add(time.Second))
	req := binary.BigEndian.AppendUint32(nil, nbdRequestMagic)
	req = binary.BigEndian.AppendUint16(req, 0)
	req = binary.BigEndian.AppendUint16(req, nbdCmdDisc)
	req = append(req, make([]byte, 20)...)
	_, _ = cl.c.Write(req)
	cl.c.Close()
}
