package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
)

// CreateToken makes an API token (admin only); the answer holds its secret,
// shown this once.
func (c *Client) CreateToken(ctx context.Context, spec api.TokenSpec) (api.Token, error) {
	var t api.Token
	err := c.do(ctx, http.MethodPost, "/tokens", nil, spec, &t)
	return t, err
}

// ListTokens lists the API tokens, without their secrets (admin only).
func (c *Client) ListTokens(ctx context.Context) ([]api.Token, error) {
	var list api.List[api.Token]
	err := c.do(ctx, http.MethodGet, "/tokens", nil, nil, &list)
	return list.Items, err
}

// RevokeToken revokes the token with id: its next request is refused and
// its connections end (admin only).
func (c *Client) RevokeToken(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/tokens/"+url.PathEscape(id), nil, nil, nil)
}

// ListTenants lists the tenants with their quotas and use (admin only).
func (c *Client) ListTenants(ctx context.Context) ([]api.Tenant, error) {
	var list api.List[api.Tenant]
	err := c.do(ctx, http.MethodGet, "/tenants", nil, nil, &list)
	return list.Items, err
}

// SetTenant sets a tenant's quota (admin only).
func (c *Client) SetTenant(ctx context.Context, name string, spec api.TenantSpec) (api.Tenant, error) {
	var t api.Tenant
	err := c.do(ctx, http.MethodPut, "/tenants/"+url.PathEscape(name), nil, spec, &t)
	return t, err
}

// WhoAmI says what the client's token is: its tenant and role.
func (c *Client) WhoAmI(ctx context.Context) (api.WhoAmI, error) {
	var w api.WhoAmI
	err := c.do(ctx, http.MethodGet, "/whoami", nil, nil, &w)
	return w, err
}

// IsForbidden reports whether err is a refusal for the token's role.
func IsForbidden(err error) bool { return Code(err) == api.CodeForbidden }

// IsQuota reports whether err is a refusal by a tenant's quota.
func IsQuota(err error) bool { return Code(err) == api.CodeQuota }

// EventQuery selects audit events: numbered after After, at or after Since
// (zero: any), the last Limit of them (0: the server's bound).
type EventQuery struct {
	After int64
	Since time.Time
	Limit int
}

// ListEvents reads the node's audit log, oldest first: every change asked
// and every refused credential (a tenant's token reads its tenant's).
func (c *Client) ListEvents(ctx context.Context, q EventQuery) ([]api.Event, error) {
	v := url.Values{}
	if q.After > 0 {
		v.Set("after", strconv.FormatInt(q.After, 10))
	}
	if !q.Since.IsZero() {
		v.Set("since", q.Since.UTC().Format(time.RFC3339Nano))
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	var list api.List[api.Event]
	err := c.do(ctx, http.MethodGet, "/events", v, nil, &list)
	return list.Items, err
}
