package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/quiverstorage/quiver/internal/api"
)

// Client calls one quiver server. It is safe for concurrent use.
type Client struct {
	base  string // scheme://host[/prefix] with no trailing slash
	httpc *http.Client
	token string
	tls   *tls.Config
}

// Option configures a Client made by New.
type Option func(*Client)

// WithToken sends "Authorization: Bearer <token>" with every request.
func WithToken(token string) Option {
	return func(c *Client) { c.token = token }
}

// WithHTTPClient makes the Client send its requests through hc (timeouts,
// TLS, a test transport). For a unix:// base URL hc's Transport, when set,
// must be an *http.Transport: New dials the socket through a copy of it.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) { c.httpc = hc }
}

// WithTLSConfig makes the Client verify an https:// server with cfg (for
// example the CAs of a --ca-file). It applies to the transport of the
// HTTP client in use (WithHTTPClient's, or a copy of the default), which
// must be an *http.Transport.
func WithTLSConfig(cfg *tls.Config) Option {
	return func(c *Client) { c.tls = cfg }
}

// New returns a Client for the server at baseURL: "http://host:port",
// "https://host:port" or "unix:///path/to.sock".
func New(baseURL string, opts ...Option) (*Client, error) {
	c := &Client{httpc: http.DefaultClient}
	for _, opt := range opts {
		opt(c)
	}
	if c.tls != nil {
		hc, err := tlsHTTPClient(c.httpc, c.tls)
		if err != nil {
			return nil, err
		}
		c.httpc = hc
	}
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, fmt.Errorf("server URL %q: %w", baseURL, err)
	}
	switch u.Scheme {
	case "http", "https":
		if u.Host == "" {
			return nil, fmt.Errorf("server URL %q: no host", baseURL)
		}
		if u.RawQuery != "" || u.Fragment != "" {
			return nil, fmt.Errorf("server URL %q: must not have a query or fragment", baseURL)
		}
		c.base = strings.TrimSuffix(u.Scheme+"://"+u.Host+u.EscapedPath(), "/")
	case "unix":
		if u.Host != "" || u.Path == "" {
			return nil, fmt.Errorf("server URL %q: want unix:///absolute/path/to.sock", baseURL)
		}
		hc, err := unixHTTPClient(c.httpc, u.Path)
		if err != nil {
			return nil, fmt.Errorf("server URL %q: %w", baseURL, err)
		}
		c.httpc = hc
		// The host is a placeholder: every connection goes to the socket.
		c.base = "http://unix"
	default:
		return nil, fmt.Errorf("server URL %q: want http://host:port, https://host:port or unix:///path/to.sock", baseURL)
	}
	return c, nil
}

// tlsHTTPClient returns a copy of hc that verifies servers with cfg.
func tlsHTTPClient(hc *http.Client, cfg *tls.Config) (*http.Client, error) {
	if hc == nil {
		hc = http.DefaultClient
	}
	return withTransport(hc, "set its TLS configuration", func(tr *http.Transport) {
		tr.TLSClientConfig = cfg.Clone()
	})
}

// unixHTTPClient returns a copy of hc whose connections all go to the unix
// socket at path.
func unixHTTPClient(hc *http.Client, path string) (*http.Client, error) {
	return withTransport(hc, "dial a unix socket", func(tr *http.Transport) {
		tr.Proxy = nil
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
	})
}

// withTransport returns a copy of hc with a copy of its transport (the
// default one when it has none) changed by set; hc itself is untouched. A
// transport other than *http.Transport cannot be changed: the error says
// what for.
func withTransport(hc *http.Client, what string, set func(*http.Transport)) (*http.Client, error) {
	var tr *http.Transport
	switch t := hc.Transport.(type) {
	case nil:
		tr = http.DefaultTransport.(*http.Transport).Clone()
	case *http.Transport:
		tr = t.Clone()
	default:
		return nil, fmt.Errorf("the HTTP client's transport is %T, want *http.Transport to %s", t, what)
	}
	set(tr)
	copied := *hc
	copied.Transport = tr
	return &copied, nil
}

// segment escapes one path segment, refusing an empty one: an empty name
// would silently address a different route.
func segment(what, name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("%s name is empty", what)
	}
	return url.PathEscape(name), nil
}

// maxErrorBody bounds how much of an error response is read.
const maxErrorBody = 1 << 20

// CallOption changes one request: see IdempotencyKey, IdempotentCreate and
// Force.
type CallOption func(*call)

type call struct {
	header http.Header
	query  url.Values
}

// IdempotencyKey names a create request (header api.IdempotencyKeyHeader):
// the key is stored with the object made, and a create of a taken name
// returns the existing object only when it was made with the same key and
// the same spec. Send the same key when retrying a request whose answer was
// lost; without a key a taken name is always a conflict (IsConflict).
func IdempotencyKey(key string) CallOption {
	return func(c *call) { c.header.Set(api.IdempotencyKeyHeader, key) }
}

// IdempotentCreate makes a create of a taken name return the existing object
// when its spec is the same, whatever key it was made with
// (?idempotent=true).
func IdempotentCreate() CallOption {
	return func(c *call) { c.query.Set(api.QueryIdempotent, "true") }
}

// Force lets a destructive operation (rollback, disk removal) go ahead while
// writers are connected to the volume (?force=true); without it the server
// refuses with IsInUse.
func Force() CallOption {
	return func(c *call) { c.query.Set(api.QueryForce, "true") }
}

// Recursive deletes a volume's snapshots with it (?recursive=true);
// without it a volume with snapshots is refused with IsHasSnapshots.
func Recursive() CallOption {
	return func(c *call) { c.query.Set(api.QueryRecursive, "true") }
}

// Shred crypto-shreds an encrypted volume as it is deleted
// (?shred=true): the KEKs of its data key are destroyed first. also names
// the clones that share its data key, shredded with it; without them such a
// volume is refused with IsKeyShared.
func Shred(also ...string) CallOption {
	return func(c *call) {
		c.query.Set(api.QueryShred, "true")
		if len(also) > 0 {
			c.query.Set(api.QueryShredAlso, strings.Join(also, ","))
		}
	}
}

// do sends one request and decodes a 2xx answer into out (when out is not
// nil and the answer has a body). Anything else becomes an *Error.
func (c *Client) do(ctx context.Context, method, path string, query url.Values, in, out any, opts ...CallOption) error {
	if in == nil {
		return c.doBody(ctx, method, path, query, "", nil, out, opts...)
	}
	data, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("%s %s: encode request: %w", method, path, err)
	}
	return c.doBody(ctx, method, path, query, "application/json", bytes.NewReader(data), out, opts...)
}

// doBody is do with a body of its own type (none when body is nil).
func (c *Client) doBody(ctx context.Context, method, path string, query url.Values, contentType string, body io.Reader, out any,
	opts ...CallOption) error {
	cl := call{header: http.Header{}, query: url.Values{}}
	for k, v := range query {
		cl.query[k] = v
	}
	for _, opt := range opts {
		opt(&cl)
	}
	target := c.base + api.Version + path
	if len(cl.query) > 0 {
		target += "?" + cl.query.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, target, body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Accept", "application/json")
	for k, v := range cl.header {
		req.Header[k] = v
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.httpc.Do(req)
	if err != nil {
		return err // *url.Error already names the method and URL
	}
	defer func() {
		// Drain a little so the connection can be reused.
		_, _ = io.CopyN(io.Discard, resp.Body, 4<<10)
		resp.Body.Close()
	}()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return decodeError(resp)
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("%s %s: decode %d response: %w", method, path, resp.StatusCode, err)
	}
	return nil
}

// decodeError turns a non-2xx response into an *Error. A body that is not
// the API's error envelope (a proxy's page, say) is kept as the message.
func decodeError(resp *http.Response) error {
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	e := &Error{Status: resp.StatusCode}
	var envelope api.ErrorBody
	if err == nil && json.Unmarshal(data, &envelope) == nil && envelope.Error.Message != "" {
		e.Detail = envelope.Error
		return e
	}
	e.Detail.Message = strings.TrimSpace(string(data))
	if len(e.Detail.Message) > 200 {
		e.Detail.Message = e.Detail.Message[:200] + "…"
	}
	if e.Detail.Message == "" {
		e.Detail.Message = resp.Status
	}
	return e
}

// errNoJob guards against a 202 without a usable job.
var errNoJob = errors.New("server answered without a job id")
