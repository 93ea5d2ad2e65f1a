package nbd

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
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
	tc := tls.Server(c.nc, c.srv.cfg.TLS)
	if err := tc.Handshake(); err != nil { // bounded by the negotiation's deadline on c.nc
		return fmt.Errorf("TLS handshake: %w", err)
	}
	c.nc, c.raw, c.tlsOut = tc, nil, bufio.NewWriterSize(tc, tlsWriteBuffer)
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
func (c *conn) sendTLS(bufs [][]byte) error {
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.srv.cfg.SendTimeout))
	for _, b := range bufs {
		if _, err := c.tlsOut.Write(b); err != nil {
			return err
		}
	}
	return c.tlsOut.Flush()
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
