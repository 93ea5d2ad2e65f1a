package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/quiverstorage/quiver/internal/api"
)

// Attach attaches every disk of a volume for a node and returns the
// attachment with its token. A node already attached fails with IsConflict,
// unless opts allow its attachment (as for CreateVolume) and the mode is the
// same: then that attachment is returned with its token.
func (c *Client) Attach(ctx context.Context, volume string, spec api.AttachmentSpec, opts ...CallOption) (api.Attachment, error) {
	var a api.Attachment
	p, err := segment("volume", volume)
	if err != nil {
		return a, err
	}
	err = c.do(ctx, http.MethodPost, "/volumes/"+p+"/attachments", nil, spec, &a, opts...)
	return a, err
}

// ListAttachments lists the attachments of a volume, implicit ones included.
// Tokens are not shown.
func (c *Client) ListAttachments(ctx context.Context, volume string) ([]api.Attachment, error) {
	p, err := segment("volume", volume)
	if err != nil {
		return nil, err
	}
	var list api.List[api.Attachment]
	err = c.do(ctx, http.MethodGet, "/volumes/"+p+"/attachments", nil, nil, &list)
	return list.Items, err
}

// FindAttachments lists the attachments of every volume matching selector
// (all volumes when ""), without their tokens.
func (c *Client) FindAttachments(ctx context.Context, selector string) ([]api.Attachment, error) {
	query := url.Values{}
	if selector != "" {
		query.Set("selector", selector)
	}
	var list api.List[api.Attachment]
	err := c.do(ctx, http.MethodGet, "/attachments", query, nil, &list)
	return list.Items, err
}

// GetAttachment returns one attachment, without its token.
func (c *Client) GetAttachment(ctx context.Context, volume, id string) (api.Attachment, error) {
	var a api.Attachment
	p, err := attachmentPath(volume, id)
	if err != nil {
		return a, err
	}
	err = c.do(ctx, http.MethodGet, p, nil, nil, &a)
	return a, err
}

// Detach deletes an attachment: its NBD connections are closed and its token
// refused from then on. Detaching an unknown attachment fails with
// IsNotFound.
func (c *Client) Detach(ctx context.Context, volume, id string) error {
	p, err := attachmentPath(volume, id)
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodDelete, p, nil, nil, nil)
}

// TransferWriter gives the writer role of a volume to an attachment: the
// epoch grows by one and every other attachment is fenced.
func (c *Client) TransferWriter(ctx context.Context, volume, id string) (api.Attachment, error) {
	var a api.Attachment
	p, err := attachmentPath(volume, id)
	if err != nil {
		return a, err
	}
	err = c.do(ctx, http.MethodPost, p+"/writer", nil, struct{}{}, &a)
	return a, err
}

func attachmentPath(volume, id string) (string, error) {
	v, err := segment("volume", volume)
	if err != nil {
		return "", err
	}
	a, err := segment("attachment", id)
	if err != nil {
		return "", err
	}
	return "/volumes/" + v + "/attachments/" + a, nil
}
