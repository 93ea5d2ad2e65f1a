package kmip

import (
	kmipgo "github.com/gemalto/kmip-go"
	"github.com/gemalto/kmip-go/kmip14"
)

// The request and response payloads of the operations quiver uses (KMIP
// 1.4, section 4), those that kmip-go does not define. Field names are the
// KMIP tags' normalized names, which the TTLV encoder maps to tags.

type idPayload struct {
	UniqueIdentifier string
}

type revokeRequest struct {
	UniqueIdentifier string
	RevocationReason revocationReason
}

type revocationReason struct {
	RevocationReasonCode kmip14.RevocationReasonCode
	RevocationMessage    string `ttlv:",omitempty"`
}

type encryptRequest struct {
	UniqueIdentifier                      string
	CryptographicParameters               kmipgo.CryptographicParameters
	Data                                  []byte
	IVCounterNonce                        []byte `ttlv:",omitempty"`
	AuthenticatedEncryptionAdditionalData []byte `ttlv:",omitempty"`
}

type encryptResponse struct {
	UniqueIdentifier           string
	Data                       []byte
	IVCounterNonce             []byte `ttlv:",omitempty"`
	AuthenticatedEncryptionTag []byte `ttlv:",omitempty"`
}

type decryptRequest struct {
	UniqueIdentifier                      string
	CryptographicParameters               kmipgo.CryptographicParameters
	Data                                  []byte
	IVCounterNonce                        []byte `ttlv:",omitempty"`
	AuthenticatedEncryptionAdditionalData []byte `ttlv:",omitempty"`
	AuthenticatedEncryptionTag            []byte `ttlv:",omitempty"`
}

type decryptResponse struct {
	UniqueIdentifier string
	Data             []byte
}

type getAttributesRequest struct {
	UniqueIdentifier string
	AttributeName    []string
}

type getAttributesResponse struct {
	UniqueIdentifier string
	Attribute        []kmipgo.Attribute
}
