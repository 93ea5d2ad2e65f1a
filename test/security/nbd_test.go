package security

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// nbdConn is a minimal NBD client (fixed newstyle, NBD_OPT_GO, simple
// replies), enough to be a well-behaved client or an abusive one.
type nbdConn struct {
	nc     net.Conn
	tls    *tls.Config // when set, NBD_OPT_STARTTLS first, then this client configuration
	r      *bufio.Reader
	size   uint64
	cookie uint64
}

// dialFrom connects to addr from the loopback address src ("" any).
func dialFrom(src, addr string, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	if src != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
	}
	return d.Dial("tcp", addr)
}

// nbdOpen connects from src and negotiates export.
func nbdOpen(src, addr, export string, timeout time.Duration) (*nbdConn, error) {
	return nbdOpenTLS(src, addr, export, nil, timeout)
}

// nbdOpenTLS connects from src, upgrades to TLS with cfg (none when nil)
// and negotiates export.
func nbdOpenTLS(src, addr, export string, cfg *tls.Config, timeout time.Duration) (*nbdConn, error) {
	nc, err := dialFrom(src, addr, timeout)
	if err != nil {
		return nil, err
	}
	c := &nbdConn{nc: nc, r: bufio.NewReaderSize(nc, 1<<20), tls: cfg}
	if err := c.negotiate(export, timeout); err != nil {
		c.nc.Close()
		return nil, err
	}
	return c, nil
}

// optionReply reads one option reply: its type and data.
func (c *nbdConn) optionReply() (uint32, []byte, error) {
	var h [20]byte
	if _, err := io.ReadFull(c.r, h[:]); err != nil {
		return 0, nil, fmt.Errorf("option reply: %w", err)
	}
	typ, n := binary.BigEndian.Uint32(h[12:]), binary.BigEndian.Uint32(h[16:])
	p := make([]byte, n)
	_, err := io.ReadFull(c.r, p)
	return typ, p, err
}

// startTLS sends the client's flags and NBD_OPT_STARTTLS, and moves the
// connection onto TLS.
func (c *nbdConn) startTLS() error {
	msg := binary.BigEndian.AppendUint32(nil, 3)
	msg = append(msg, "IHAVEOPT"...)
	msg = binary.BigEndian.AppendUint32(msg, 5) // NBD_OPT_STARTTLS
	msg = binary.BigEndian.AppendUint32(msg, 0)
	if _, err := c.nc.Write(msg); err != nil {
		return err
	}
	typ, p, err := c.optionReply()
	if err != nil {
		return err
	}
	if typ != 1 {
		return fmt.Errorf("STARTTLS refused (%#x): %s", typ, p)
	}
	tc := tls.Client(c.nc, c.tls)
	if err := tc.Handshake(); err != nil {
		return fmt.Errorf("TLS handshake: %w", err)
	}
	c.nc, c.r = tc, bufio.NewReaderSize(tc, 1<<20)
	return nil
}

func (c *nbdConn) negotiate(export string, timeout time.Duration) error {
	_ = c.nc.SetDeadline(time.Now().Add(timeout))
	defer c.nc.SetDeadline(time.Time{})
	var hello [18]byte
	if _, err := io.ReadFull(c.r, hello[:]); err != nil {
		return fmt.Errorf("greeting: %w", err)
	}
	if string(hello[:8]) != "NBDMAGIC" || string(hello[8:16]) != "IHAVEOPT" {
		return errors.New("not an NBD server")
	}
	var msg []byte
	if c.tls != nil {
		if err := c.startTLS(); err != nil {
			return err
		}
		_ = c.nc.SetDeadline(time.Now().Add(timeout))
	} else {
		msg = binary.BigEndian.AppendUint32(nil, 3) // fixed newstyle, no zeroes
	}
	data := binary.BigEndian.AppendUint32(nil, uint32(len(export)))
	data = append(data, export...)
	data = append(data, 0, 0) // no information requests
	msg = append(msg, "IHAVEOPT"...)
	msg = binary.BigEndian.AppendUint32(msg, 7) // NBD_OPT_GO
	msg = binary.BigEndian.AppendUint32(msg, uint32(len(data)))
	msg = append(msg, data...)
	if _, err := c.nc.Write(msg); err != nil {
		return err
	}
	for {
		typ, p, err := c.optionReply()
		if err != nil {
			return err
		}
		switch {
		case typ == 1: // ACK
			return nil
		case typ&(1<<31) != 0:
			return fmt.Errorf("GO refused (%#x): %s", typ, p[min(len(p), 0):])
		case typ == 3 && len(p) >= 12 && binary.BigEndian.Uint16(p) == 0:
			c.size = binary.BigEndian.Uint64(p[2:])
		}
	}
}

// send sends one request without waiting for its reply.
func (c *nbdConn) send(typ uint16, off uint64, length uint32, payload []byte) error {
	c.cookie++
	h := make([]byte, 28, 28+len(payload))
	binary.BigEndian.PutUint32(h, 0x25609513)
	binary.BigEndian.PutUint16(h[6:], typ)
	binary.BigEndian.PutUint64(h[8:], c.cookie)
	binary.BigEndian.PutUint64(h[16:], off)
	binary.BigEndian.PutUint32(h[24:], length)
	_, err := c.nc.Write(append(h, payload...))
	return err
}

// reply reads one simple reply and, for a READ, its data into buf.
func (c *nbdConn) reply(buf []byte) error {
	var h [16]byte
	if _, err := io.ReadFull(c.r, h[:]); err != nil {
		return err
	}
	if binary.BigEndian.Uint32(h[:]) != 0x67446698 {
		return errors.New("bad reply magic")
	}
	if e := binary.BigEndian.Uint32(h[4:]); e != 0 {
		return fmt.Errorf("NBD error %d", e)
	}
	_, err := io.ReadFull(c.r, buf)
	return err
}

func (c *nbdConn) readAt(buf []byte, off uint64, timeout time.Duration) error {
	_ = c.nc.SetDeadline(time.Now().Add(timeout))
	defer c.nc.SetDeadline(time.Time{})
	if err := c.send(0, off, uint32(len(buf)), nil); err != nil {
		return err
	}
	return c.reply(buf)
}

func (c *nbdConn) writeAt(p []byte, off uint64, timeout time.Duration) error {
	_ = c.nc.SetDeadline(time.Now().Add(timeout))
	defer c.nc.SetDeadline(time.Time{})
	if err := c.send(1, off, uint32(len(p)), p); err != nil {
		return err
	}
	return c.reply(nil)
}

func (c *nbdConn) Close() error { return c.nc.Close() }
