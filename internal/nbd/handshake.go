package nbd

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"
)

// errAbort ends negotiation on NBD_OPT_ABORT: the client wants to go.
var errAbort = errors.New("client aborted negotiation")

// negotiation is the state of the option haggling phase of one connection.
type negotiation struct {
	c          *conn
	noZeroes   bool
	structured bool
	baseAlloc  bool // base:allocation selected by NBD_OPT_SET_META_CONTEXT
	// bitmaps are the qemu:dirty-bitmap: contexts selected by the last
	// NBD_OPT_SET_META_CONTEXT, for export metaExport (metacontext.go).
	bitmaps    []dirtyBitmap
	metaExport string
	tls        bool // NBD_OPT_STARTTLS succeeded: the connection is a *tls.Conn

	// options counts the options answered; budget is how many the client
	// may send: maxOptions, plus optionsPerExport per export in the
	// longest NBD_OPT_LIST answer (listed).
	options, budget, listed int
}

// negotiate runs the fixed newstyle handshake ("Fixed newstyle
// negotiation") until the client picks an export with NBD_OPT_GO or
// NBD_OPT_EXPORT_NAME. On success c.disk is open and the transmission
// phase can start.
func (c *conn) negotiate(ctx context.Context) error {
	var hello [18]byte
	binary.BigEndian.PutUint64(hello[0:], magicNBD)
	binary.BigEndian.PutUint64(hello[8:], magicIHaveOpt)
	binary.BigEndian.PutUint16(hello[16:], flagFixedNewstyle|flagNoZeroes)
	if _, err := c.nc.Write(hello[:]); err != nil {
		return err
	}
	var cf [4]byte
	if _, err := io.ReadFull(c.r, cf[:]); err != nil {
		return err
	}
	_ = c.nc.SetDeadline(c.handshakeDeadline) // the greeting is over: the option phase's own bound
	clientFlags := binary.BigEndian.Uint32(cf[:])
	if clientFlags&clientFlagFixedNewstyle == 0 {
		return errors.New("client does not speak fixed newstyle negotiation")
	}
	if clientFlags&^uint32(clientFlagFixedNewstyle|clientFlagNoZeroes) != 0 {
		return fmt.Errorf("unknown client flags %#x", clientFlags)
	}
	n := &negotiation{c: c, noZeroes: clientFlags&clientFlagNoZeroes != 0, budget: maxOptions}
	for ; n.options < n.budget; n.options++ {
		done, err := n.option(ctx)
		if err != nil || done {
			return n.ended(err)
		}
	}
	return n.ended(fmt.Errorf("%w: %d options (%d allowed after listing %d exports)",
		errTooManyOptions, n.options, n.budget, n.listed))
}

// errTooManyOptions ends a negotiation that went on for more options than
// its budget.
var errTooManyOptions = errors.New("too many options")

// optionsPerExport is how many options a client may send per export it was
// listed, on top of maxOptions: nbdinfo --list sends NBD_OPT_INFO and
// NBD_OPT_LIST_META_CONTEXT for each (two), a client that also sets a meta
// context or asks twice has room to spare. The bound keeps a client from
// negotiating forever; it grows only with NBD_OPT_LIST's answer, and asking
// for the list again does not add to it.
const optionsPerExport = 8

// ended logs why a negotiation that did not reach transmission closes the
// connection (a client's abort or hang-up at Debug, anything the server
// decided or a timeout at Info) and returns err.
func (n *negotiation) ended(err error) error {
	if err == nil {
		return nil
	}
	var ne net.Error
	switch {
	case errors.Is(err, errAbort):
		n.c.log.Debug("negotiation ended: client sent NBD_OPT_ABORT", "options", n.options)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		n.c.log.Debug("negotiation ended: client hung up", "options", n.options, "err", err)
	case errors.As(err, &ne) && ne.Timeout():
		n.c.log.Info("closing NBD connection: negotiation timed out", "options", n.options, "err", err)
	default:
		n.c.log.Info("closing NBD connection during negotiation", "options", n.options, "err", err)
	}
	return err
}

// option reads and answers one option; done is true once the connection
// enters the transmission phase.
func (n *negotiation) option(ctx context.Context) (done bool, err error) {
	var hdr [16]byte
	if _, err := io.ReadFull(n.c.r, hdr[:]); err != nil {
		return false, err
	}
	if binary.BigEndian.Uint64(hdr[0:]) != magicIHaveOpt {
		return false, errors.New("bad option magic")
	}
	opt := binary.BigEndian.Uint32(hdr[8:])
	length := binary.BigEndian.Uint32(hdr[12:])
	if length > maxOptionLength {
		if opt == optExportName || length > 16*maxOptionLength {
			return false, fmt.Errorf("option %d: %d bytes is too long", opt, length)
		}
		if _, err := io.CopyN(io.Discard, n.c.r, int64(length)); err != nil {
			return false, err
		}
		return false, n.replyError(opt, repErrTooBig, "option too long")
	}
	data := make([]byte, length)
	if _, err := io.ReadFull(n.c.r, data); err != nil {
		return false, err
	}
	if n.c.srv.cfg.RequireTLS && !n.tls {
		switch opt {
		case optExportName: // no way to refuse it politely
			return false, errors.New("NBD_OPT_EXPORT_NAME before TLS: TLS is required")
		case optAbort, optStartTLS:
		default:
			return false, n.replyError(opt, repErrTLSReqd, "TLS is required: send NBD_OPT_STARTTLS first")
		}
	}
	switch opt {
	case optExportName:
		return true, n.exportName(ctx, data)
	case optAbort:
		_ = n.reply(opt, repAck, nil)
		return false, errAbort
	case optList:
		return false, n.list(ctx, data)
	case optInfo, optGo:
		return n.infoGo(ctx, opt, data)
	case optStructuredReply:
		if len(data) != 0 {
			return false, n.replyError(opt, repErrInvalid, "NBD_OPT_STRUCTURED_REPLY takes no data")
		}
		n.structured = true
		return false, n.reply(opt, repAck, nil)
	case optListMetaContext, optSetMetaContext:
		return false, n.metaContext(ctx, opt, data)
	case optStartTLS:
		return false, n.startTLS(data)
	default:
		return false, n.replyError(opt, repErrUnsup, fmt.Sprintf("option %d is not supported", opt))
	}
}

// reply sends one option reply ("Option reply").
func (n *negotiation) reply(opt, typ uint32, data []byte) error {
	buf := make([]byte, 20+len(data))
	binary.BigEndian.PutUint64(buf[0:], magicOptionReply)
	binary.BigEndian.PutUint32(buf[8:], opt)
	binary.BigEndian.PutUint32(buf[12:], typ)
	binary.BigEndian.PutUint32(buf[16:], uint32(len(data)))
	copy(buf[20:], data)
	_, err := n.c.nc.Write(buf)
	return err
}

// replyError sends an error reply with a message for humans: a string, so
// at most maxStringLength bytes of UTF-8.
func (n *negotiation) replyError(opt, typ uint32, msg string) error {
	n.c.log.Debug("option refused", "opt", opt, "reply", typ&^repFlagError, "msg", msg)
	if len(msg) > maxStringLength {
		msg = strings.ToValidUTF8(msg[:maxStringLength], "")
	}
	return n.reply(opt, typ, []byte(msg))
}

func validName(name []byte) bool {
	return len(name) <= maxStringLength && !strings.ContainsRune(string(name), 0)
}

// exportName handles NBD_OPT_EXPORT_NAME, which cannot fail politely: on
// error the connection is closed.
func (n *negotiation) exportName(ctx context.Context, data []byte) error {
	if !validName(data) {
		return errors.New("bad export name")
	}
	if err := n.c.open(ctx, string(data)); err != nil {
		return err
	}
	n.c.setFlags(n)
	n.c.bitmaps = n.bitmapsFor(string(data))
	buf := make([]byte, 10, 10+124)
	binary.BigEndian.PutUint64(buf[0:], uint64(n.c.size))
	binary.BigEndian.PutUint16(buf[8:], n.c.flags)
	if !n.noZeroes {
		buf = buf[:10+124]
	}
	_, err := n.c.nc.Write(buf)
	return err
}

// list handles NBD_OPT_LIST.
func (n *negotiation) list(ctx context.Context, data []byte) error {
	if len(data) != 0 {
		return n.replyError(optList, repErrInvalid, "NBD_OPT_LIST takes no data")
	}
	exports, err := n.c.srv.exports.List(n.c.withPeerCertificate(ctx))
	if err != nil {
		return n.replyError(optList, openErrorCode(err), refusalMessage(err))
	}
	for _, e := range exports {
		b := make([]byte, 4+len(e.Name)+len(e.Description))
		binary.BigEndian.PutUint32(b, uint32(len(e.Name)))
		copy(b[4:], e.Name)
		copy(b[4+len(e.Name):], e.Description)
		if err := n.reply(optList, repServer, b); err != nil {
			return err
		}
	}
	if len(exports) > n.listed {
		n.listed = len(exports)
		n.budget = maxOptions + optionsPerExport*n.listed
		// A client that lists asks about each export next, and may take a
		// while per export: libnbd 1.14 corks the end of every
		// NBD_OPT_LIST_META_CONTEXT (MSG_MORE), so over TCP each export
		// costs it the kernel's 200 ms cork timeout. The negotiation's
		// deadline grows with the list, as the option budget does, so
		// that nbdinfo --list finishes however many exports there are.
		// Only a client allowed to list gets the time (LIST is refused
		// when tokens are required).
		extended := time.Now().Add(n.c.srv.cfg.HandshakeTimeout + time.Duration(n.listed)*timePerListedExport)
		if extended.After(n.c.handshakeDeadline) {
			n.c.handshakeDeadline = extended
			_ = n.c.nc.SetDeadline(extended)
		}
	}
	return n.reply(optList, repAck, nil)
}

// timePerListedExport is how much longer a negotiation may last per export
// NBD_OPT_LIST returned (see list).
const timePerListedExport = 250 * time.Millisecond

// infoGo handles NBD_OPT_INFO and NBD_OPT_GO: export name, then the
// information requests.
func (n *negotiation) infoGo(ctx context.Context, opt uint32, data []byte) (bool, error) {
	if len(data) < 6 {
		return false, n.replyError(opt, repErrInvalid, "option data too short")
	}
	nameLen := binary.BigEndian.Uint32(data)
	if uint64(nameLen)+6 > uint64(len(data)) {
		return false, n.replyError(opt, repErrInvalid, "export name length beyond option data")
	}
	name := data[4 : 4+nameLen]
	rest := data[4+nameLen:]
	nreq := int(binary.BigEndian.Uint16(rest))
	if len(rest) != 2+2*nreq {
		return false, n.replyError(opt, repErrInvalid, "information request count does not match option length")
	}
	if !validName(name) {
		return false, n.replyError(opt, repErrInvalid, "bad export name")
	}
	wantName, wantDesc := false, false
	for i := range nreq {
		switch binary.BigEndian.Uint16(rest[2+2*i:]) {
		case infoName:
			wantName = true
		case infoDescription:
			wantDesc = true
		}
	}
	if err := n.c.open(ctx, string(name)); err != nil {
		return false, n.replyError(opt, openErrorCode(err), refusalMessage(err))
	}
	n.c.setFlags(n)
	n.c.bitmaps = n.bitmapsFor(string(name))
	if err := n.sendInfo(opt, wantName, wantDesc); err != nil {
		return false, err
	}
	if err := n.reply(opt, repAck, nil); err != nil {
		return false, err
	}
	if opt == optInfo {
		n.c.closeDisk()
		return false, nil
	}
	return true, nil
}

func (n *negotiation) sendInfo(opt uint32, wantName, wantDesc bool) error {
	export := make([]byte, 12)
	binary.BigEndian.PutUint16(export[0:], infoExport)
	binary.BigEndian.PutUint64(export[2:], uint64(n.c.size))
	binary.BigEndian.PutUint16(export[10:], n.c.flags)
	if err := n.reply(opt, repInfo, export); err != nil {
		return err
	}
	bs := make([]byte, 14)
	binary.BigEndian.PutUint16(bs[0:], infoBlockSize)
	binary.BigEndian.PutUint32(bs[2:], minBlockSize)
	binary.BigEndian.PutUint32(bs[6:], preferredBlockSize)
	binary.BigEndian.PutUint32(bs[10:], maxPayload)
	if err := n.reply(opt, repInfo, bs); err != nil {
		return err
	}
	for _, s := range []struct {
		want bool
		typ  uint16
		text string
	}{{wantName, infoName, n.c.export}, {wantDesc, infoDescription, n.c.description}} {
		if !s.want {
			continue
		}
		b := make([]byte, 2+len(s.text))
		binary.BigEndian.PutUint16(b, s.typ)
		copy(b[2:], s.text)
		if err := n.reply(opt, repInfo, b); err != nil {
			return err
		}
	}
	return nil
}
