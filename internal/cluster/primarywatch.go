package cluster

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// WatchPrimary returns a channel that receives whenever the primary of
// volume may have changed, until ctx ends; then it is closed. It receives
// once the watch is in place (a change before it is seen through that
// first signal), then at each change of the volume's record (a promotion,
// a hand-over) or of primary/<volume> (taken, or gone with its holder's
// lease), and again each time a lost watch is made anew (what changed
// meanwhile is unknown). Signals are coalesced: a reader that is behind
// gets one for all. A reader reads the primary again with Role; a signal
// without a change costs it only that.
func (ps Primaries) WatchPrimary(ctx context.Context, volume string) <-chan struct{} {
	out := make(chan struct{}, 1)
	signal := func() {
		select {
		case out <- struct{}{}:
		default:
		}
	}
	go func() {
		defer close(out)
		for ctx.Err() == nil {
			ps.watchPrimaryOnce(ctx, volume, signal)
			sleep(ctx, 200*time.Millisecond)
		}
	}()
	return out
}

// watchPrimaryOnce watches the keys that name volume's primary until the
// watch breaks or ctx ends, signalling once both watches are in place and
// at each change.
func (ps Primaries) watchPrimaryOnce(ctx context.Context, volume string, signal func()) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	vw := ps.n.cli.Watch(wctx, ps.n.key("volumes", volume), clientv3.WithCreatedNotify())
	pw := ps.n.cli.Watch(wctx, ps.n.key("primary", volume), clientv3.WithCreatedNotify())
	created := 0
	for {
		var wr clientv3.WatchResponse
		var ok bool
		select {
		case wr, ok = <-vw:
		case wr, ok = <-pw:
		}
		if !ok || wr.Err() != nil || wr.Canceled {
			return
		}
		if wr.Created {
			if created++; created == 2 {
				signal()
			}
			continue
		}
		if len(wr.Events) > 0 {
			signal()
		}
	}
}
