package webhook

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
)

// ErrBadCA: the CA bundle given for the webhook's configuration holds no
// certificate, or one that is not a CA.
var ErrBadCA = errors.New("bad CA bundle")

// CheckCA parses a PEM CA bundle: at least one certificate, every one a CA.
func CheckCA(bundle []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	n := 0
	for rest := bundle; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %v: %w", n+1, err, ErrBadCA)
		}
		if !cert.IsCA {
			return nil, fmt.Errorf("certificate %d (%s): not a CA: %w", n+1, cert.Subject, ErrBadCA)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("no PEM certificate: %w", ErrBadCA)
	}
	return pool, nil
}

// patchAttempts bounds the rounds of read and patch when others change the
// configuration meanwhile (another replica of the webhook writing the same
// bundle).
const patchAttempts = 5

// EnsureCABundle makes every webhook of the MutatingWebhookConfiguration
// named config trust bundle (clientConfig.caBundle), so that the API server
// accepts the webhook's serving certificate. It writes only the webhooks
// whose bundle differs, with a JSON Patch that first tests the object's
// resourceVersion, so a concurrent change is never overwritten: it reads
// again and retries. It returns how many webhooks it changed.
func (k *Kube) EnsureCABundle(ctx context.Context, config string, bundle []byte) (int, error) {
	if _, err := CheckCA(bundle); err != nil {
		return 0, err
	}
	path := "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/" + url.PathEscape(config)
	var err error
	for range patchAttempts {
		var mwc admissionregistrationv1.MutatingWebhookConfiguration
		if err = k.do(ctx, http.MethodGet, path, "", nil, &mwc); err != nil {
			if errors.Is(err, errNotFound) {
				return 0, fmt.Errorf("MutatingWebhookConfiguration %s does not exist (install it first): %w", config, err)
			}
			return 0, fmt.Errorf("MutatingWebhookConfiguration %s: %w", config, err)
		}
		if len(mwc.Webhooks) == 0 {
			return 0, fmt.Errorf("MutatingWebhookConfiguration %s has no webhooks", config)
		}
		ops := []map[string]any{{"op": "test", "path": "/metadata/resourceVersion", "value": mwc.ResourceVersion}}
		for i, w := range mwc.Webhooks {
			if !bytes.Equal(w.ClientConfig.CABundle, bundle) {
				// []byte is base64 in JSON, as caBundle is on the wire.
				ops = append(ops, map[string]any{"op": "add", "path": fmt.Sprintf("/webhooks/%d/clientConfig/caBundle", i), "value": bundle})
			}
		}
		if len(ops) == 1 {
			return 0, nil
		}
		body, merr := json.Marshal(ops)
		if merr != nil {
			return 0, merr
		}
		err = k.do(ctx, http.MethodPatch, path, "application/json-patch+json", body, nil)
		if err == nil {
			return len(ops) - 1, nil
		}
		if !errors.Is(err, errConflict) {
			return 0, fmt.Errorf("caBundle of MutatingWebhookConfiguration %s: %w", config, err)
		}
	}
	return 0, fmt.Errorf("caBundle of MutatingWebhookConfiguration %s: changed by others %d times in a row: %w", config, patchAttempts, err)
}
