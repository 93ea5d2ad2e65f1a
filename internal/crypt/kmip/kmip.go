package kmip

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	kmipgo "github.com/gemalto/kmip-go"
	"github.com/gemalto/kmip-go/kmip14"
	"github.com/gemalto/kmip-go/ttlv"

	"github.com/quiverstorage/quiver/internal/crypt"
)

// Name is the provider's name in wrapped keys.
const Name = "kmip"

const (
	nonceSize = 12
	tagSize   = 16
)

// Config says how to reach a KMIP server.
type Config struct {
	// Addr is the server's host:port (KMIP's port is 5696).
	Addr string
	// TLS holds the client certificate and the CA the server's certificate
	// must chain to (see TLSConfig).
	TLS *tls.Config
	// Timeout bounds each operation, connection included; 10 s if zero.
	Timeout time.Duration
}

// TLSConfig makes the TLS configuration of a KMIP client from PEM files:
// the CA of the server's certificate and the client's certificate and key.
func TLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("kmip CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("kmip CA %s: no PEM certificate", caFile)
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("kmip client certificate: %w", err)
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, nil
}

// Provider wraps data keys under KEKs held by a KMIP server. It holds no
// state but its configuration: every operation is one request on a
// connection of its own, so it is safe for concurrent use.
type Provider struct {
	cfg Config
}

var _ crypt.Provider = (*Provider)(nil)

// New makes a provider of the KMIP server cfg names; it does not connect.
func New(cfg Config) (*Provider, error) {
	if cfg.Addr == "" || cfg.TLS == nil {
		return nil, errors.New("kmip: server address and TLS configuration are required")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	return &Provider{cfg: cfg}, nil
}

// Name returns Name.
func (p *Provider) Name() string { return Name }

// CreateKEK creates an AES-256 key for encrypt and decrypt in the server and
// activates it.
func (p *Provider) CreateKEK(ctx context.Context) (string, error) {
	var ta kmipgo.TemplateAttribute
	ta.Append(kmip14.TagCryptographicAlgorithm, kmip14.CryptographicAlgorithmAES)
	ta.Append(kmip14.TagCryptographicLength, 256)
	ta.Append(kmip14.TagCryptographicUsageMask, kmip14.CryptographicUsageMaskEncrypt|kmip14.CryptographicUsageMaskDecrypt)
	var created kmipgo.CreateResponsePayload
	err := p.do(ctx, kmip14.OperationCreate, kmipgo.CreateRequestPayload{
		ObjectType: kmip14.ObjectTypeSymmetricKey, TemplateAttribute: ta,
	}, &created)
	if err != nil {
		return "", fmt.Errorf("create KEK: %w", err)
	}
	if err := p.do(ctx, kmip14.OperationActivate, idPayload{created.UniqueIdentifier}, &idPayload{}); err != nil {
		return "", fmt.Errorf("activate KEK %s: %w", created.UniqueIdentifier, err)
	}
	return created.UniqueIdentifier, nil
}

func gcmParameters() kmipgo.CryptographicParameters {
	return kmipgo.CryptographicParameters{
		CryptographicAlgorithm: kmip14.CryptographicAlgorithmAES,
		BlockCipherMode:        kmip14.BlockCipherModeGCM,
		TagLength:              tagSize,
	}
}

// Wrap has the server encrypt the data key under the KEK keyID with
// AES-256-GCM; the wrapped bytes are nonce, ciphertext and tag.
func (p *Provider) Wrap(ctx context.Context, keyID string, key *crypt.DataKey) (crypt.WrappedKey, error) {
	w := crypt.WrappedKey{Provider: Name, KeyID: keyID, Algorithm: crypt.AlgorithmGCM}
	nonce := make([]byte, nonceSize)
	if _, err := rand.Read(nonce); err != nil {
		return crypt.WrappedKey{}, err
	}
	var out encryptResponse
	err := p.do(ctx, kmip14.OperationEncrypt, encryptRequest{
		UniqueIdentifier: keyID, CryptographicParameters: gcmParameters(), Data: key.Bytes(),
		IVCounterNonce: nonce, AuthenticatedEncryptionAdditionalData: w.AAD(),
	}, &out)
	if err != nil {
		return crypt.WrappedKey{}, fmt.Errorf("wrap under KEK %s: %w", keyID, p.classify(ctx, kmip14.OperationEncrypt, keyID, err))
	}
	if len(out.Data) != crypt.DataKeySize || len(out.AuthenticatedEncryptionTag) != tagSize {
		return crypt.WrappedKey{}, fmt.Errorf("wrap under KEK %s: server %s answered %d bytes and a %d-byte tag",
			keyID, p.cfg.Addr, len(out.Data), len(out.AuthenticatedEncryptionTag))
	}
	w.Wrapped = append(append(nonce, out.Data...), out.AuthenticatedEncryptionTag...)
	return w, nil
}

// Unwrap has the server decrypt a wrapped data key.
func (p *Provider) Unwrap(ctx context.Context, w crypt.WrappedKey) (*crypt.DataKey, error) {
	switch {
	case w.Provider != Name:
		return nil, fmt.Errorf("unwrap: provider %q, not %q: %w", w.Provider, Name, crypt.ErrProvider)
	case w.Algorithm != crypt.AlgorithmGCM:
		return nil, fmt.Errorf("unwrap: algorithm %q, want %q: %w", w.Algorithm, crypt.AlgorithmGCM, crypt.ErrUnwrap)
	case len(w.Wrapped) != nonceSize+crypt.DataKeySize+tagSize:
		return nil, fmt.Errorf("unwrap: wrapped key of %d bytes: %w", len(w.Wrapped), crypt.ErrUnwrap)
	}
	var out decryptResponse
	err := p.do(ctx, kmip14.OperationDecrypt, decryptRequest{
		UniqueIdentifier: w.KeyID, CryptographicParameters: gcmParameters(),
		IVCounterNonce:                        w.Wrapped[:nonceSize],
		Data:                                  w.Wrapped[nonceSize : nonceSize+crypt.DataKeySize],
		AuthenticatedEncryptionTag:            w.Wrapped[nonceSize+crypt.DataKeySize:],
		AuthenticatedEncryptionAdditionalData: w.AAD(),
	}, &out)
	if err != nil {
		return nil, fmt.Errorf("unwrap under KEK %s: %w", w.KeyID, p.classify(ctx, kmip14.OperationDecrypt, w.KeyID, err))
	}
	defer clear(out.Data)
	return crypt.DataKeyFrom(out.Data)
}

// RevokeKEK revokes the KEK (reason: cessation of operation): the server
// refuses it for encrypt and decrypt from then on.
func (p *Provider) RevokeKEK(ctx context.Context, keyID string) error {
	err := p.do(ctx, kmip14.OperationRevoke, revokeRequest{
		UniqueIdentifier: keyID,
		RevocationReason: revocationReason{
			RevocationReasonCode: kmip14.RevocationReasonCodeCessationOfOperation,
			RevocationMessage:    "revoked by quiver",
		},
	}, &idPayload{})
	if err != nil {
		return fmt.Errorf("revoke KEK %s: %w", keyID, err)
	}
	return nil
}

// DestroyKEK revokes the KEK if it is active and destroys it.
func (p *Provider) DestroyKEK(ctx context.Context, keyID string) error {
	state, err := p.state(ctx, keyID)
	if err != nil {
		return fmt.Errorf("destroy KEK %s: %w", keyID, err)
	}
	if state == kmip14.StateActive {
		if err := p.RevokeKEK(ctx, keyID); err != nil {
			return fmt.Errorf("destroy KEK %s: %w", keyID, err)
		}
	}
	if err := p.do(ctx, kmip14.OperationDestroy, idPayload{keyID}, &idPayload{}); err != nil {
		return fmt.Errorf("destroy KEK %s: %w", keyID, err)
	}
	return nil
}

// state asks the server for the KEK's state.
func (p *Provider) state(ctx context.Context, keyID string) (kmip14.State, error) {
	var out getAttributesResponse
	err := p.do(ctx, kmip14.OperationGetAttributes, getAttributesRequest{
		UniqueIdentifier: keyID, AttributeName: []string{kmip14.TagState.CanonicalName()},
	}, &out)
	if err != nil {
		return 0, err
	}
	for _, a := range out.Attribute {
		if a.AttributeName != kmip14.TagState.CanonicalName() {
			continue
		}
		switch v := a.AttributeValue.(type) {
		case kmip14.State:
			return v, nil
		case ttlv.EnumValue:
			return kmip14.State(v), nil
		case uint32:
			return kmip14.State(v), nil
		}
		return 0, fmt.Errorf("KEK %s: state of type %T", keyID, a.AttributeValue)
	}
	return 0, fmt.Errorf("KEK %s: the server %s returned no state", keyID, p.cfg.Addr)
}

// classify names the failure of an encrypt or decrypt that the server
// refused. A KEK no longer active gives ErrKEKRevoked (the server answers
// "permission denied" then, as for other reasons). A decrypt under an active
// KEK that fails for a cryptographic or unspecified reason is a wrapped key
// that does not authenticate (PyKMIP answers "general failure" to a wrong
// GCM tag): ErrUnwrap.
func (p *Provider) classify(ctx context.Context, op kmip14.Operation, keyID string, err error) error {
	var re *resultError
	if !errors.As(err, &re) {
		return err
	}
	switch re.reason {
	case kmip14.ResultReasonPermissionDenied, kmip14.ResultReasonGeneralFailure, kmip14.ResultReasonCryptographicFailure:
	default:
		return err
	}
	state, serr := p.state(ctx, keyID)
	switch {
	case serr != nil:
		return err
	case state != kmip14.StateActive:
		return fmt.Errorf("state %s: %w: %w", state, crypt.ErrKEKRevoked, err)
	case op == kmip14.OperationDecrypt && re.reason != kmip14.ResultReasonPermissionDenied:
		return fmt.Errorf("%w: %w", crypt.ErrUnwrap, err)
	}
	return err
}
