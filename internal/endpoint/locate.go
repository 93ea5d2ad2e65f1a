package endpoint

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

// Locator finds a volume's primary through the storage nodes' API. It asks
// the node that answered last first and the others in turn when it does
// not answer, so a dead storage node costs one failed connection, not the
// endpoint's view of the cluster.
type Locator struct {
	nodes []*client.Client
	// TryTimeout bounds one question to one node (default 2 s).
	TryTimeout time.Duration

	mu   sync.Mutex
	last int // the node that answered last
}

// NewLocator asks the storage nodes whose API clients are given.
func NewLocator(nodes ...*client.Client) *Locator {
	return &Locator{nodes: nodes, TryTimeout: 2 * time.Second}
}

// Primary returns where volume is served now. A node that answers (even
// "no primary now") ends the search: every node reads the same placement.
func (l *Locator) Primary(ctx context.Context, volume string) (api.Primary, error) {
	if len(l.nodes) == 0 {
		return api.Primary{}, errors.New("no storage node configured (--server)")
	}
	l.mu.Lock()
	first := l.last
	l.mu.Unlock()
	var errs []error
	for i := range l.nodes {
		n := (first + i) % len(l.nodes)
		tctx, cancel := context.WithTimeout(ctx, l.TryTimeout)
		pr, err := l.nodes[n].Primary(tctx, volume)
		cancel()
		if err == nil {
			l.mu.Lock()
			l.last = n
			l.mu.Unlock()
			return pr, nil
		}
		if answered(err) {
			l.mu.Lock()
			l.last = n
			l.mu.Unlock()
			return api.Primary{}, err
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return api.Primary{}, fmt.Errorf("no storage node answered where volume %s is served: %w", volume, errors.Join(errs...))
}

// answered tells an API's own answer (the volume is unknown, the token is
// refused, no primary now) from a node that could not be asked.
func answered(err error) bool {
	var ae *client.Error
	return errors.As(err, &ae) && ae.Detail.Code != ""
}

// resolver asks where volume is served at most once per interval: every disk
// of a volume, and every connection, share the answer.
type resolver struct {
	loc    *Locator
	volume string
	fresh  time.Duration

	mu   sync.Mutex
	at   time.Time
	pr   api.Primary
	err  error
	busy chan struct{} // closed when the question in flight is answered
}

func (r *resolver) primary(ctx context.Context) (api.Primary, error) {
	for {
		r.mu.Lock()
		if !r.at.IsZero() && time.Since(r.at) < r.fresh {
			pr, err := r.pr, r.err
			r.mu.Unlock()
			return pr, err
		}
		if r.busy != nil {
			busy := r.busy
			r.mu.Unlock()
			select {
			case <-busy:
				continue
			case <-ctx.Done():
				return api.Primary{}, ctx.Err()
			}
		}
		busy := make(chan struct{})
		r.busy = busy
		r.mu.Unlock()
		pr, err := r.loc.Primary(ctx, r.volume)
		r.mu.Lock()
		r.pr, r.err, r.at, r.busy = pr, err, time.Now(), nil
		r.mu.Unlock()
		close(busy)
		return pr, err
	}
}

// final tells an answer that will not change by asking again (the volume
// is unknown, the token refused, NBD not served over TCP) from one that
// will (no primary during a failover, a node that could not be asked).
func final(err error) bool {
	return answered(err) && client.Code(err) != api.CodeUnavailable && client.Code(err) != api.CodeInternal
}
