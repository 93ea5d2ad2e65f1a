package forward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/nbdclient"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestStartedRequestsFollowAMove: requests started without waiting
// (pool.Starter), in flight at a primary that is cut off (its writes
// hang), are sent again to the new primary as soon as the primary moves,
// and each ends exactly once, without an error, from there.
func TestStartedRequestsFollowAMove(t *testing.T) {
	s := &store{data: make([]byte, 1<<20)}
	a, b := startPrimary(t, s), startPrimary(t, s)
	var current atomic.Pointer[primary]
	current.Store(a)
	resolve := func(context.Context) (string, error) { return current.Load().addr, nil }
	moves := make(chan struct{}, 1)
	d, err := Open(context.Background(), "vol/disk", resolve, Options{RequestTimeout: time.Hour, RetryFor: time.Hour, Logger: quiet,
		Moves: func(ctx context.Context) <-chan struct{} {
			out := make(chan struct{})
			go func() {
				defer close(out)
				for {
					select {
					case <-ctx.Done():
						return
					case <-moves:
						out <- struct{}{}
					}
				}
			}()
			return out
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()

	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	a.fail.Store(failure{holdErr{hold}})
	const n = 8
	var calls [n]atomic.Int32
	ends := make(chan error, n)
	for i := range n {
		d.StartWrite(bytes.Repeat([]byte{byte(i + 1)}, 4096), int64(i)*4096, false, func(err error, _ bool) {
			calls[i].Add(1)
			ends <- err
		})
	}
	d.Unplug()
	for a.held.Load() < n {
		time.Sleep(5 * time.Millisecond) // every write waits at a
	}
	current.Store(b)
	moves <- struct{}{}
	for range n {
		select {
		case err := <-ends:
			if err != nil {
				t.Fatalf("started write after the move: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("started writes still wait at the old primary 30 s after the move")
		}
	}
	if got := b.writes.Load(); got != n {
		t.Errorf("the new primary got %d writes, want %d", got, n)
	}
	got := make([]byte, n*4096)
	if err := d.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if !bytes.Equal(got[i*4096:(i+1)*4096], bytes.Repeat([]byte{byte(i + 1)}, 4096)) {
			t.Errorf("block %d does not hold its write", i)
		}
		if c := calls[i].Load(); c != 1 {
			t.Errorf("write %d ended %d times, want once", i, c)
		}
	}
}

// TestForwardedThroughAFailover: a client of a node that forwards (its NBD
// server starts each READ and WRITE on the forwarding Disk from its reader)
// keeps many requests in flight while its primary abandons every write
// (closes the connection unanswered, as a primary whose lease ran short)
// and the primary then moves: every request is answered without an error,
// and the disk holds every write.
func TestForwardedThroughAFailover(t *testing.T) {
	s := &store{data: make([]byte, 1<<20)}
	a, b := startPrimary(t, s), startPrimary(t, s)
	var current atomic.Pointer[primary]
	current.Store(a)
	resolve := func(context.Context) (string, error) { return current.Load().addr, nil }
	opts := Options{RequestTimeout: 5 * time.Second, RetryFor: 30 * time.Second, MaxPause: 20 * time.Millisecond, Logger: quiet}
	via := serveVia(t, func(ctx context.Context, name string) (nbd.Export, error) {
		d, err := Open(ctx, name, resolve, opts)
		if err != nil {
			return nbd.Export{}, err
		}
		return nbd.Export{Disk: d}, nil
	})
	c, err := nbdclient.Dial(context.Background(), via, "vol/disk", nbdclient.Options{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.WriteAt(bytes.Repeat([]byte{9}, 4096), 0, false); err != nil {
		t.Fatal(err)
	}

	a.fail.Store(failure{fmt.Errorf("lease short: %w", nbd.ErrAbandon)})
	const n = 32
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := range n {
		wg.Go(func() {
			if err := c.WriteAt(bytes.Repeat([]byte{byte(i + 1)}, 4096), int64(i)*4096, i%4 == 0); err != nil {
				errs <- fmt.Errorf("write %d: %w", i, err)
			}
		})
		wg.Go(func() {
			if err := c.ReadAt(make([]byte, 4096), int64(n+i)*4096); err != nil {
				errs <- fmt.Errorf("read %d: %w", i, err)
			}
		})
	}
	time.Sleep(200 * time.Millisecond) // the writes are tried again at a meanwhile
	current.Store(b)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	got := make([]byte, n*4096)
	if err := c.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if !bytes.Equal(got[i*4096:(i+1)*4096], bytes.Repeat([]byte{byte(i + 1)}, 4096)) {
			t.Errorf("block %d does not hold its write", i)
		}
	}
	if b.writes.Load() < n {
		t.Errorf("the new primary got %d writes, want %d", b.writes.Load(), n)
	}
}

// TestStartedGivesUp: a started request with no primary answering ends
// with ErrAbandon after RetryFor, as ReadAt and WriteAt do.
func TestStartedGivesUp(t *testing.T) {
	s := &store{data: make([]byte, 1<<20)}
	a := startPrimary(t, s)
	addr := a.addr
	d, err := Open(context.Background(), "vol/disk", func(context.Context) (string, error) { return addr, nil },
		Options{RequestTimeout: time.Second, RetryFor: time.Second, DialTimeout: 200 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	a.stop()
	ends := make(chan error, 2)
	d.StartWrite(make([]byte, 512), 0, false, func(err error, _ bool) { ends <- err })
	d.StartRead(make([]byte, 512), 0, func(err error, _ bool) { ends <- err })
	d.Unplug()
	for range 2 {
		select {
		case err := <-ends:
			if !errors.Is(err, nbd.ErrAbandon) {
				t.Errorf("started request with no primary: %v, want ErrAbandon", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("a started request with no primary had not ended after 20 s (RetryFor is 1 s)")
		}
	}
}
