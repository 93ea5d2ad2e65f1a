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
	c.ncMu.Lock()
	c.nc, c.raw, c.tlsOut, c.tlsTr = tc, nil, bufio.NewWriterSize(tc, tlsWriteBuffer), tr
	c.ncMu.Unlock()
	// Nothing negotiated in plain text carries over the upgrade.
	n.tls, n.structured, n.baseAlloc, n.bitmaps, n.metaExport = true, false, false, nil, ""
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
	rerr error // an error the socket returned with data, given with the next Read

	// Where the stream is, from the bytes given so far (track).
	left int                   // bytes of the current record's payload still to give
	hdr  [tlsRecordHeader]byte // a header given in part
	nhdr int                   // how much of it; 0 and left 0: at a record boundary
	bulk bool                  // the last record was large: reads pass straight through
}

// TLS record framing (RFC 8446, section 5.1): a 5-byte header whose last
// two bytes are the length of the record's payload.
const (
	tlsRecordHeader = 5
	tlsReadBuffer   = 64 << 10
	// tlsSmallRecord is the largest payload of a record of requests: a
	// record holding a 4 KiB WRITE with its header is well under it, the
	// 16 KiB records of a large WRITE's data are above it.
	tlsSmallRecord = 8 << 10
)

// Read gives crypto/tls what came from the socket. While the records are
// small, requests one by one as libnbd sends them, it gives at most one
// record per call, from a buffer filled with one read of the socket:
// crypto/tls reads a record by asking for the bytes it lacks and takes
// whatever more a read returns, and would otherwise hold the next requests
// in a buffer of its own where nothing can see them. With reads that stop
// at the record's end, every byte crypto/tls has not decrypted yet is
// here, and pending can tell the connection's reader that more requests
// have come: it runs them before sending the replies it has, as on a plain
// socket, instead of one write per reply. Once a large record comes (the
// data of a large WRITE), reads go straight into crypto/tls's buffer
// again, as large as the socket gives, without a copy: batching does not
// matter there, and the copy and the shorter reads cost 20-40% more CPU
// per MiB written (measured).
func (t *tlsTransport) Read(p []byte) (int, error) {
	if t.rpos == len(t.rbuf) {
		if t.rerr != nil {
			err := t.rerr
			t.rerr = nil
			return 0, err
		}
		if t.bulk {
			n, err := t.Conn.Read(p)
			give := t.bulkCut(p[:n])
			t.track(p[:give])
			if give == n || n == 0 {
				return n, err
			}
			// Small records came behind the large ones: keep them here
			// and give them one by one again.
			t.rbuf = append(t.rbuf[:0], p[give:n]...)
			t.rpos, t.rerr, t.bulk = 0, err, false
			if give > 0 {
				return give, nil
			}
		} else if err := t.fill(0); err != nil {
			return 0, err
		}
	}
	limit := len(t.rbuf) - t.rpos
	switch {
	case t.bulk:
	case t.left > 0:
		limit = t.left
	default: // at a header: it says how long the record is
		need := tlsRecordHeader - t.nhdr
		if err := t.fill(need); err != nil {
			return 0, err
		}
		var h [tlsRecordHeader]byte
		copy(h[copy(h[:], t.hdr[:t.nhdr]):], t.rbuf[t.rpos:])
		limit = need + (int(h[3])<<8 | int(h[4]))
	}
	n := min(len(p), limit, len(t.rbuf)-t.rpos)
	copy(p, t.rbuf[t.rpos:t.rpos+n])
	t.rpos += n
	t.track(p[:n])
	return n, nil
}

// bulkCut returns how much of b, read straight into crypto/tls's buffer,
// to give it: up to the first record that is small or whose size is not
// known yet (its header is cut short), once the records begun before are
// given whole. track is not called on b yet.
func (t *tlsTransport) bulkCut(b []byte) int {
	left, nh, i := t.left, t.nhdr, 0
	var h [tlsRecordHeader]byte
	copy(h[:], t.hdr[:nh])
	for i < len(b) {
		if left > 0 {
			k := min(left, len(b)-i)
			left, i = left-k, i+k
			continue
		}
		start := i - nh // < 0: the header began in an earlier read, already given
		k := copy(h[nh:], b[i:])
		nh, i = nh+k, i+k
		if nh < tlsRecordHeader { // a header cut short: its record is not judged yet
			if start >= 0 {
				return start
			}
			return len(b) // it began in an earlier read: its bytes go on
		}
		nh, left = 0, int(h[3])<<8|int(h[4])
		if start >= 0 && left <= tlsSmallRecord {
			return start
		}
	}
	return len(b)
}

// track follows the record framing through b, bytes just given.
func (t *tlsTransport) track(b []byte) {
	for len(b) > 0 {
		if t.left > 0 {
			k := min(t.left, len(b))
			t.left, b = t.left-k, b[k:]
			continue
		}
		k := copy(t.hdr[t.nhdr:], b)
		t.nhdr, b = t.nhdr+k, b[k:]
		if t.nhdr == tlsRecordHeader {
			t.left = int(t.hdr[3])<<8 | int(t.hdr[4])
			t.nhdr = 0
			t.bulk = t.left > tlsSmallRecord
		}
	}
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
// another record under crypto/tls (tlsPending).
func (c *conn) moreBuffered() bool { return c.r.Buffered() >= requestHeaderSize || c.tlsPending() }

// tlsPending reports whether a TLS connection has bytes of another request
// that crypto/tls has not read yet, while requests are small: after a large
// READ or WRITE (c.bigReq) it says no, and replies go out as before. Holding
// them while the next large WRITE's records came in cost 20-40% more CPU
// per MiB written over TLS (measured), and such requests gain nothing from
// batched replies. The reader's own buffer is c.r.
func (c *conn) tlsPending() bool { return !c.bigReq && c.tlsTr != nil && c.tlsTr.pending() }

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
