package kmip

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"time"

	kmipgo "github.com/gemalto/kmip-go"
	"github.com/gemalto/kmip-go/kmip14"
	"github.com/gemalto/kmip-go/ttlv"

	"github.com/quiverstorage/quiver/internal/crypt"
)

// resultError is a KMIP operation that the server refused.
type resultError struct {
	server  string
	op      kmip14.Operation
	reason  kmip14.ResultReason
	message string
}

func (e *resultError) Error() string {
	return fmt.Sprintf("KMIP server %s refused %s: %s: %s", e.server, e.op, e.reason, e.message)
}

// Unwrap maps the result reasons that crypt has errors for: a missing key,
// and a decryption that fails (a wrapped key that does not authenticate).
func (e *resultError) Unwrap() error {
	switch e.reason {
	case kmip14.ResultReasonItemNotFound:
		return crypt.ErrKEKNotFound
	case kmip14.ResultReasonCryptographicFailure:
		return crypt.ErrUnwrap
	}
	return nil
}

// do sends one request of one batch item on a connection of its own and
// decodes the response's payload into out.
func (p *Provider) do(ctx context.Context, op kmip14.Operation, payload, out any) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	req, err := ttlv.Marshal(kmipgo.RequestMessage{
		RequestHeader: kmipgo.RequestHeader{
			ProtocolVersion: kmipgo.ProtocolVersion{ProtocolVersionMajor: 1, ProtocolVersionMinor: 4},
			BatchCount:      1,
		},
		BatchItem: []kmipgo.RequestBatchItem{{Operation: op, RequestPayload: payload}},
	})
	if err != nil {
		return fmt.Errorf("kmip: encode %s: %w", op, err)
	}
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", p.cfg.Addr)
	if err != nil {
		return fmt.Errorf("KMIP server %s: %w: %w", p.cfg.Addr, crypt.ErrUnreachable, err)
	}
	defer raw.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = raw.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = raw.SetDeadline(time.Now()) })
	defer stop()
	cfg := p.cfg.TLS.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(p.cfg.Addr)
	}
	conn := tls.Client(raw, cfg)
	// A failed handshake is a configuration to fix (certificates, CA), not
	// an outage: it is not ErrUnreachable.
	if err := conn.HandshakeContext(ctx); err != nil {
		return fmt.Errorf("KMIP server %s: TLS handshake: %w", p.cfg.Addr, err)
	}
	if _, err := conn.Write(req); err != nil {
		return fmt.Errorf("KMIP server %s: %s: %w: %w", p.cfg.Addr, op, crypt.ErrUnreachable, err)
	}
	msg, err := ttlv.NewDecoder(bufio.NewReader(conn)).NextTTLV()
	if err != nil {
		return fmt.Errorf("KMIP server %s: %s: no response: %w: %w", p.cfg.Addr, op, crypt.ErrUnreachable, err)
	}
	var resp kmipgo.ResponseMessage
	if err := ttlv.Unmarshal(msg, &resp); err != nil {
		return fmt.Errorf("KMIP server %s: %s: decode response: %w", p.cfg.Addr, op, err)
	}
	if len(resp.BatchItem) != 1 {
		return fmt.Errorf("KMIP server %s: %s: %d batch items in the response, want 1", p.cfg.Addr, op, len(resp.BatchItem))
	}
	item := resp.BatchItem[0]
	if item.ResultStatus != kmip14.ResultStatusSuccess {
		return &resultError{server: p.cfg.Addr, op: op, reason: item.ResultReason, message: item.ResultMessage}
	}
	body, ok := item.ResponsePayload.(ttlv.TTLV)
	if !ok {
		return fmt.Errorf("KMIP server %s: %s: response without a payload", p.cfg.Addr, op)
	}
	if err := ttlv.Unmarshal(body, out); err != nil {
		return fmt.Errorf("KMIP server %s: %s: decode payload: %w", p.cfg.Addr, op, err)
	}
	return nil
}
