package server

import (
	"net/http"
	"time"
)

// APILimits bounds what HTTP clients can hold (docs/security.md). Zero
// values take the defaults.
type APILimits struct {
	MaxConns        int // connections at once (default 512); more are closed at accept
	MaxConnsPerPeer int // connections at once from one IP address (default 64)
	// HeaderTimeout: a request's headers must arrive within it (default
	// 5 s); BodyTimeout: then its body (default 10 s); IdleTimeout: a
	// kept-alive connection with no request is closed after it (default
	// 30 s).
	HeaderTimeout time.Duration
	BodyTimeout   time.Duration
	IdleTimeout   time.Duration
}

// maxHeaderBytes bounds a request's headers; API requests carry a few
// short ones.
const maxHeaderBytes = 64 << 10

// DefaultAPILimits are the limits with every default filled in (for flags
// that show them).
func DefaultAPILimits() APILimits {
	var l APILimits
	l.defaults()
	return l
}

func (l *APILimits) defaults() {
	if l.MaxConns <= 0 {
		l.MaxConns = 512
	}
	if l.MaxConnsPerPeer <= 0 {
		l.MaxConnsPerPeer = 64
	}
	if l.HeaderTimeout <= 0 {
		l.HeaderTimeout = 5 * time.Second
	}
	if l.BodyTimeout <= 0 {
		l.BodyTimeout = 10 * time.Second
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = 30 * time.Second
	}
}

// httpServer returns an http.Server for h with the limits' timeouts. There
// is no read timeout (the API bounds the body itself, apiserver.BodyTimeout:
// net/http's ReadTimeout would cancel a request's context once it passed)
// and no write timeout: a synchronous snapshot or clone answers when it is
// done.
func (l APILimits) httpServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.HeaderTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
	}
}
