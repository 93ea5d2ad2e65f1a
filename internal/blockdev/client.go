package blockdev

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// ErrAgentUnreachable: the device agent did not answer.
var ErrAgentUnreachable = errors.New("device agent unreachable")

// Client is Devices served by a device agent on a unix socket.
type Client struct {
	socket string
	http   *http.Client
}

var _ Devices = (*Client)(nil)

// NewClient returns a client of the agent listening on socket.
func NewClient(socket string) *Client {
	// Attach waits for nbdfuse to connect (up to startTimeout) and for
	// losetup; the caller's context bounds it too.
	return &Client{socket: socket, http: UnixHTTP(socket, startTimeout+time.Minute)}
}

// UnixHTTP is an HTTP client of a node-local service's unix socket (the
// device agent's, the endpoint's): every request goes to socket, whatever
// its URL's host; timeout bounds a request.
func UnixHTTP(socket string, timeout time.Duration) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConns: 2,
	}
	return &http.Client{Transport: tr, Timeout: timeout}
}

func (c *Client) call(ctx context.Context, op string, r Request) (Reply, error) {
	body, err := json.Marshal(r)
	if err != nil {
		return Reply{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://agent/v1/"+op, bytes.NewReader(body))
	if err != nil {
		return Reply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return Reply{}, fmt.Errorf("%w at %s: %v (is `quiver device-agent` running?)", ErrAgentUnreachable, c.socket, err)
	}
	defer resp.Body.Close()
	var out Reply
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxRequest)).Decode(&out); err != nil {
		return Reply{}, fmt.Errorf("device agent at %s: %s, unreadable answer: %v", c.socket, resp.Status, err)
	}
	if resp.StatusCode == http.StatusOK {
		return out, nil
	}
	switch out.Code {
	case "BadRequest":
		return Reply{}, fmt.Errorf("%w: %s", ErrBadRequest, out.Error)
	case "NoTool":
		return Reply{}, fmt.Errorf("device agent: %s: %w", out.Error, ErrNoTool)
	}
	return Reply{}, fmt.Errorf("device agent: %s", out.Error)
}

func (c *Client) Attach(ctx context.Context, fuseDir, file, uri string, readOnly bool) (string, int, error) {
	out, err := c.call(ctx, "attach", Request{FuseDir: fuseDir, File: file, URI: uri, ReadOnly: readOnly})
	return out.Loop, out.PID, err
}

func (c *Client) Detach(ctx context.Context, fuseDir, file, loop string, pid int) error {
	_, err := c.call(ctx, "detach", Request{FuseDir: fuseDir, File: file, Loop: loop, PID: pid})
	return err
}

func (c *Client) Healthy(ctx context.Context, fuseDir, file, loop string, pid int) (bool, error) {
	out, err := c.call(ctx, "healthy", Request{FuseDir: fuseDir, File: file, Loop: loop, PID: pid})
	return out.Healthy, err
}
