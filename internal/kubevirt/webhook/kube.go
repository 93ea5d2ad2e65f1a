package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Kube is the webhook's client of the Kubernetes API: JSON requests for the
// few objects it reads (claims.go) and its own MutatingWebhookConfiguration
// (cabundle.go). Its HTTP client comes from client-go (rest.HTTPClientFor),
// which carries every way a kubeconfig or a pod authenticates: the service
// account token, re-read as the kubelet rotates it, client certificates,
// exec plugins. client-go's typed clientsets are not used: they would bring
// every API group into the binary for four requests.
type Kube struct {
	// Server is the API server's URL, e.g. https://10.96.0.1:443.
	Server string
	// HTTP is the client; it authenticates the requests and trusts the
	// API server's CA. http.DefaultClient when nil.
	HTTP *http.Client
}

// NewKube builds a Kube from a kubeconfig file, or from the pod's service
// account (in-cluster config) when kubeconfig is "".
func NewKube(kubeconfig string) (*Kube, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config (outside a pod, give --kubeconfig): %w", err)
		}
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	server := cfg.Host
	if !strings.Contains(server, "://") {
		server = "https://" + server
	}
	return &Kube{Server: strings.TrimSuffix(server, "/") + strings.TrimSuffix(cfg.APIPath, "/"), HTTP: hc}, nil
}

// Answers of the API server that callers act on.
var (
	errNotFound = errors.New("not found")
	errConflict = errors.New("conflict")
)

// do sends one request with an optional body of contentType and decodes a
// 200 answer into out (when not nil).
func (k *Kube) do(ctx context.Context, method, path, contentType string, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(k.Server, "/")+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	hc := k.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return err
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("kubernetes API %s %s: %w", method, path, errNotFound)
	case resp.StatusCode == http.StatusConflict || resp.StatusCode == http.StatusUnprocessableEntity:
		return fmt.Errorf("kubernetes API %s %s: %s: %s: %w", method, path, resp.Status, strings.TrimSpace(string(data)), errConflict)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("kubernetes API %s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(data)))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}
