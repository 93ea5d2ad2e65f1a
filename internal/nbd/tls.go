package nbd

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// TLS ("TLS support" in the NBD protocol specification). A client upgrades
// the connection with NBD_OPT_STARTTLS during negotiation; the server then
// runs a TLS handshake (crypto/tls, x509 certificates: Go has no TLS-PSK)
// and the rest of the negotiation and the whole transmission phase go
// through the *tls.Conn. Such a connection stays in Go's poller and sends
// its replies with tls.Conn.Write through a buffer (sendTLS), not with the
// raw sendmsg of plain connections (socket.go): the bytes on the socket
// are records that crypto/tls seals.
//
// With Config.RequireTLS every option before NBD_OPT_STARTTLS other than
// NBD_OPT_ABORT is refused with NBD_REP_ERR_TLS_REQD, and
// NBD_OPT_EXPORT_NAME closes the connection, so no export name, list or
// size is told to a client that has not upgraded.

// startTLS handles NBD_OPT_STARTTLS.
func (n *negotiation) startTLS(data []byte) error {
	c := n.c
	switch {
	case c.srv.cfg.TLS == nil:
		return n.replyError(optStartTLS, repErrPolicy, "TLS is not enabled on this server")
	case n.tls:
		return n.replyError(optStartTLS, repErrInvalid, "TLS is already negotiated")
	case len(data) != 0:
		return n.replyError(optStartTLS, repErrInvalid, "NBD_OPT_STARTTLS takes no data")
	case c.r.Buffered() != 0:
		// Bytes sent after STARTTLS but before our reply would be read
		// as if they had come through TLS: a man in the middle could
		// inject options that way (the STARTTLS injection of SMTP).
		return errors.New("data after NBD_OPT_STARTTLS before its reply")
	}
	if err := n.reply(optStartTLS, repAck, nil); err != nil {
		return err
	}
	tr := &tlsTransport{Conn: c.nc}
	tc := tls.Server(tr, c.srv.cfg.TLS)
	if err := tc.Handshake(); err != nil { // bounded by the negotiation's deadline on c.nc
		return fmt.Errorf("TLS handshake: %w", err)
	}
	c.nc, c.raw, c.tlsOut, c.tlsTr = tc, nil, bufio.NewWriterSize(tc, tlsWriteBuffer), tr
	// Nothing negotiated in plain text carries over the upgrade.
	n.tls, n.structured, n.baseAlloc = true, false, false
	c.log.Debug("TLS negotiated", "version", tls.VersionName(tc.ConnectionState().Version))
	return nil
}

// tlsWriteBuffer gathers a reply's header and data into TLS records of up
// to 16 KiB, instead of one record per buffer.
const tlsWriteBuffer = 64 << 10

// sendTLS writes bufs through the TLS connection; c.wmu is held. A client
// that takes none of it for Config.SendTimeout is given up on.
//
// crypto/tls seals at most 16 KiB per record and writes each record to
// its connection at once: one system call per record, 64 for a 1 MiB READ
// reply (measured: 66 writes per 1 MiB request). Under the TLS connection
// is a tlsTransport that gathers the records sealed here and sends them in
// writes of up to tlsSendMax, the last at the end of the batch.
func (c *conn) sendTLS(bufs [][]byte) error {
	tr := c.tlsTr
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.srv.cfg.SendTimeout))
	tr.gather.Store(true) // negotiation is over: replies only from here
	tr.sending.Store(true)
	err := c.writeTLS(bufs)
	tr.sending.Store(false)
	if err != nil {
		return err
	}
	return tr.flushAll()
}

func (c *conn) writeTLS(bufs [][]byte) error {
	for _, b := range bufs {
		if _, err := c.tlsOut.Write(b); err != nil {
			return err
		}
	}
	return c.tlsOut.Flush()
}

// tlsSendMax is how many sealed bytes a tlsTransport gathers before it
// writes them.
const tlsSendMax = 256 << 10

// tlsTransport is the socket under a TLS connection. Writes pass straight
// through until gather is set (the negotiation writes its replies directly
// and must not wait). From then on the records that sendTLS has sealed
// (sending is set) gather in a buffer, sent when it holds tlsSendMax and
// by flushAll at the end of sendTLS, so a reply never waits in it.
//
// crypto/tls also writes records of its own from other goroutines: an
// answer to a client's KeyUpdate (from the reader), a close_notify alert
// (from Close). Its lock orders them with sendTLS's records, so every
// Write comes in the order of the records' sequence numbers and the
// buffer keeps that order. Such a record is sent at once unless a send is
// under way; then flushAll, which loops until the buffer is empty, sends
// it after. Close never waits for a send: a reply writer may be blocked on
// a client that does not read, and cutting off that client (a revoked
// token) must not wait for it.
type tlsTransport struct {
	net.Conn
	gather  atomic.Bool
	sending atomic.Bool // sendTLS is writing its records

	flushMu sync.Mutex // held while sending; the order of sends is that of the bytes
	mu      sync.Mutex // guards buf and spare
	buf     []byte     // sealed records not yet sent
	spare   []byte     // the other buffer, empty, for writes during a send

	// The read side, used by crypto/tls from the connection's reader
	// only (Read and pending are never called concurrently).
	rbuf []byte // bytes read from the socket; rbuf[rpos:] not yet given to crypto/tls
	rpos int
	left int   // bytes of the record being given still to give; 0 at a record boundary
	rerr error // an error the socket returned with data, given with the next Read
}

// TLS record framing (RFC 8446, section 5.1): a 5-byte header whose last
// two bytes are the length of the record's payload.
const (
	tlsRecordHeader = 5
	tlsReadBuffer   = 64 << 10
)

// Read gives crypto/tls the bytes of at most one TLS record per call,
// from a buffer filled with one read of the socket. crypto/tls reads a
// record by asking for at least the bytes it lacks and takes whatever
// more a read returns; given more than one record, it would hold the
// next requests in a buffer of its own where nothing can see them. With
// reads that stop at the record's end, every byte crypto/tls has not
// decrypted yet is here, and pending can tell the connection's reader
// that more requests have come: it then runs them before sending the
// replies it has, as on a plain socket, instead of one write per reply
// (libnbd sends each request in a record of its own).
func (t *tlsTransport) Read(p []byte) (int, error) {
	if t.rpos == len(t.rbuf) {
		if t.rerr != nil {
			err := t.rerr
			t.rerr = nil
			return 0, err
		}
		if err := t.fill(0); err != nil {
			return 0, err
		}
	}
	if t.left == 0 { // a record starts here: its header says how long it is
		if err := t.fill(tlsRecordHeader); err != nil {
			return 0, err
		}
		h := t.rbuf[t.rpos:]
		t.left = tlsRecordHeader + (int(h[3])<<8 | int(h[4]))
	}
	n := min(len(p), t.left, len(t.rbuf)-t.rpos)
	copy(p, t.rbuf[t.rpos:t.rpos+n])
	t.rpos += n
	t.left -= n
	return n, nil
}

// fill reads from the socket until at least need bytes are buffered (at
// least one when need is 0), moving the unread bytes to the front first.
func (t *tlsTransport) fill(need int) error {
	if t.rbuf == nil {
		t.rbuf = make([]byte, 0, tlsReadBuffer)
	}
	have := copy(t.rbuf[:cap(t.rbuf)], t.rbuf[t.rpos:])
	t.rbuf, t.rpos = t.rbuf[:have], 0
	for len(t.rbuf) < max(need, 1) {
		if t.rerr != nil {
			err := t.rerr
			t.rerr = nil
			return err
		}
		n, err := t.Conn.Read(t.rbuf[len(t.rbuf):cap(t.rbuf)])
		t.rbuf = t.rbuf[:len(t.rbuf)+n]
		if err != nil {
			if len(t.rbuf) >= max(need, 1) {
				t.rerr = err // give the data first
				return nil
			}
			if n == 0 && len(t.rbuf) > 0 && errors.Is(err, io.EOF) {
				return io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// moreBuffered reports whether another request has come that the reader
// can read without waiting: a header in its buffer, or, over TLS, bytes of
// another record under crypto/tls.
func (c *conn) moreBuffered() bool { return c.r.Buffered() >= requestHeaderSize || c.tlsPending() }

// tlsPending reports whether a TLS connection has bytes of another request
// that crypto/tls has not read yet; the reader's own buffer is c.r.
func (c *conn) tlsPending() bool { return c.tlsTr != nil && c.tlsTr.pending() }

// pending reports whether bytes of another record have come that crypto/tls
// has not read: more requests to run before the replies go out.
func (t *tlsTransport) pending() bool { return t.rpos < len(t.rbuf) }

// Write gathers p, one record that crypto/tls sealed (it writes each
// record by itself), or sends it at once before gathering starts.
func (t *tlsTransport) Write(p []byte) (int, error) {
	if !t.gather.Load() {
		return t.Conn.Write(p)
	}
	t.mu.Lock()
	t.buf = append(t.buf, p...)
	full := len(t.buf) >= tlsSendMax
	t.mu.Unlock()
	switch {
	case t.sending.Load():
		if full {
			return len(p), t.flush()
		}
	case t.flushMu.TryLock(): // a record of crypto/tls's own
		defer t.flushMu.Unlock()
		return len(p), t.send()
	}
	return len(p), nil
}

// flush sends every gathered byte.
func (t *tlsTransport) flush() error {
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	return t.send()
}

// flushAll flushes until nothing is gathered: a record of crypto/tls's own
// written during a flush is sent too.
func (t *tlsTransport) flushAll() error {
	for {
		if err := t.flush(); err != nil {
			return err
		}
		t.mu.Lock()
		empty := len(t.buf) == 0
		t.mu.Unlock()
		if empty {
			return nil
		}
	}
}

// send sends the buffer, swapped with the spare so that writes can gather
// meanwhile; t.flushMu is held.
func (t *tlsTransport) send() error {
	t.mu.Lock()
	b := t.buf
	t.buf = t.spare[:0]
	t.mu.Unlock()
	var err error
	if len(b) > 0 {
		_, err = t.Conn.Write(b)
	}
	t.mu.Lock()
	t.spare = b[:0]
	t.mu.Unlock()
	return err
}

type peerCertKey struct{}

// PeerCertificate returns the client certificate of the connection an
// Exports.Open is for, when its TLS handshake verified one against the
// server's client CAs (mutual TLS); nil otherwise. An Exports may let it
// stand for a credential (docs/security.md, "Client certificates").
func PeerCertificate(ctx context.Context) *x509.Certificate {
	c, _ := ctx.Value(peerCertKey{}).(*x509.Certificate)
	return c
}

// withPeerCertificate returns ctx carrying the verified client certificate
// of a TLS connection, if it has one.
func (c *conn) withPeerCertificate(ctx context.Context) context.Context {
	tc, ok := c.nc.(*tls.Conn)
	if !ok {
		return ctx
	}
	if chains := tc.ConnectionState().VerifiedChains; len(chains) > 0 && len(chains[0]) > 0 {
		return context.WithValue(ctx, peerCertKey{}, chains[0][0])
	}
	return ctx
}
