package endpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/quiverstorage/quiver/internal/blockdev"
)

// ErrUnreachable: the endpoint did not answer on its control socket.
var ErrUnreachable = errors.New("endpoint unreachable")

// Client calls an endpoint's control API on its unix socket (the CSI node
// plugin's side). Its Devices (blockdev.Client) asks the same socket for
// block devices.
type Client struct {
	socket string
	http   *http.Client
	*blockdev.Client
}

// NewClient returns a client of the endpoint whose control socket is
// socket.
func NewClient(socket string) *Client {
	return &Client{socket: socket, http: blockdev.UnixHTTP(socket, time.Minute), Client: blockdev.NewClient(socket)}
}

// Publish asks the endpoint to serve v's disks and returns where.
func (c *Client) Publish(ctx context.Context, v Volume) (Published, error) {
	var p Published
	err := c.call(ctx, http.MethodPut, "/v1/volumes/"+url.PathEscape(v.Name), v, &p)
	return p, err
}

// Unpublish asks the endpoint to stop serving volume name.
func (c *Client) Unpublish(ctx context.Context, name string) error {
	return c.call(ctx, http.MethodDelete, "/v1/volumes/"+url.PathEscape(name), nil, nil)
}

// List returns the endpoint's publications.
func (c *Client) List(ctx context.Context) ([]Status, error) {
	var out []Status
	err := c.call(ctx, http.MethodGet, "/v1/volumes", nil, &out)
	return out, err
}

func (c *Client) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://endpoint"+path, body)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w at %s: %v (is `quiver endpoint` running on this node?)", ErrUnreachable, c.socket, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody*4))
	if err != nil {
		return fmt.Errorf("endpoint at %s: %w", c.socket, err)
	}
	if resp.StatusCode/100 != 2 {
		var ce controlError
		if json.Unmarshal(b, &ce) != nil || ce.Error == "" {
			return fmt.Errorf("endpoint at %s: %s", c.socket, resp.Status)
		}
		switch ce.Code {
		case "Invalid":
			return fmt.Errorf("endpoint: %s: %w", ce.Error, ErrInvalid)
		case "NotFound":
			return fmt.Errorf("endpoint: %s: %w", ce.Error, ErrNotFound)
		}
		return fmt.Errorf("endpoint: %s", ce.Error)
	}
	if out != nil && resp.StatusCode != http.StatusNoContent {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("endpoint at %s: unreadable answer: %v", c.socket, err)
		}
	}
	return nil
}
