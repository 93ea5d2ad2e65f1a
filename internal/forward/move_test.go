package forward

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/nbdclient"
)

// TestRefusalIsFinal: a primary's refusal of the export (a wrong token:
// NBD_REP_ERR_POLICY; an unknown disk: NBD_REP_ERR_UNKNOWN) is final: Open
// returns ErrRefused after one try, without trying again for RetryFor, and
// a node serving the forwarding Disk (as any node serves any volume)
// answers its client the primary's refusal as it came, reply type and
// message, so that the client cannot tell it from the primary's own.
func TestRefusalIsFinal(t *testing.T) {
	s := &store{data: make([]byte, 1<<20)}
	p := startPrimary(t, s)
	var resolves atomic.Int64
	resolve := func(context.Context) (string, error) { resolves.Add(1); return p.addr, nil }
	opts := Options{RequestTimeout: 5 * time.Second, RetryFor: 5 * time.Second,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	via := serveVia(t, func(ctx context.Context, name string) (nbd.Export, error) {
		d, err := Open(ctx, name, resolve, opts)
		if err != nil {
			return nbd.Export{}, fmt.Errorf("export %s: %w", name, err)
		}
		return nbd.Export{Disk: d}, nil
	})
	for _, name := range []string{"vol/disk/wrong-token", "vol/nodisk"} {
		resolves.Store(0)
		_, err := Open(context.Background(), name, resolve, opts)
		var r *nbd.Refused
		if !errors.Is(err, ErrRefused) || !errors.As(err, &r) {
			t.Fatalf("open %s: %v, want ErrRefused with the primary's reply", name, err)
		}
		if n := resolves.Load(); n != 1 {
			t.Errorf("open %s: %d tries, want 1: a refusal is final", name, n)
		}
		_, direct := nbdclient.Dial(context.Background(), p.addr, name, nbdclient.Options{Timeout: 5 * time.Second})
		_, forwarded := nbdclient.Dial(context.Background(), via, name, nbdclient.Options{Timeout: 5 * time.Second})
		var dr, fr *nbdclient.Refusal
		if !errors.As(direct, &dr) || !errors.As(forwarded, &fr) || *dr != *fr {
			t.Errorf("open %s: the primary refuses %v, the forwarding node %v: want the same reply", name, direct, forwarded)
		}
	}
}

// serveVia serves exports opened by open on a second NBD server, as a
// node that is not the primary serves them; it returns its address.
func serveVia(t *testing.T, open func(ctx context.Context, name string) (nbd.Export, error)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := nbd.NewServer(openFunc(open), nbd.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return ln.Addr().String()
}

type openFunc func(ctx context.Context, name string) (nbd.Export, error)

func (f openFunc) List(context.Context) ([]nbd.ExportInfo, error) { return nil, nil }
func (f openFunc) Open(ctx context.Context, name, _ string) (nbd.Export, error) {
	return f(ctx, name)
}

// TestFollowsAMove: a primary that stops answering (cut off: its writes
// hang) holds no request once the primary moves: when Moves says so, each
// Disk resolves the new primary and sends its requests in flight there at
// once, with a request timeout that would otherwise hold them for an hour.
// A move to the same primary (a change of the volume's record that is not
// a move) keeps the connection. The 30 s bound only checks liveness.
func TestFollowsAMove(t *testing.T) {
	s := &store{data: make([]byte, 1<<20)}
	a, b := startPrimary(t, s), startPrimary(t, s)
	var current atomic.Pointer[primary]
	current.Store(a)
	resolve := func(context.Context) (string, error) { return current.Load().addr, nil }
	const disks = 2
	var moves [disks]chan struct{}
	var ds [disks]*Disk
	var connects atomic.Int64
	for i := range disks {
		moves[i] = make(chan struct{}, 1)
		d, err := Open(context.Background(), "vol/disk", resolve, Options{RequestTimeout: time.Hour, RetryFor: time.Hour,
			Moves: func(ctx context.Context) <-chan struct{} {
				out := make(chan struct{})
				go func() {
					defer close(out)
					for {
						select {
						case <-ctx.Done():
							return
						case <-moves[i]:
							out <- struct{}{}
						}
					}
				}()
				return out
			},
			OnConnect: func(string) { connects.Add(1) }})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		ds[i] = d
	}
	// signal says to each Disk that the primary may have moved (a signal
	// not taken yet stands for the next).
	signal := func() {
		for i := range disks {
			select {
			case moves[i] <- struct{}{}:
			default:
			}
		}
	}
	signal() // not a move: the connections stay
	for i, d := range ds {
		if err := d.WriteAt(bytes.Repeat([]byte{1}, 4096), int64(i)*4096, false); err != nil {
			t.Fatal(err)
		}
	}

	// a is cut off: it answers nothing more.
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	a.fail.Store(failure{holdErr{hold}})
	done := make(chan error, disks)
	for i, d := range ds {
		go func() { done <- d.WriteAt(bytes.Repeat([]byte{2}, 4096), int64(i)*4096, false) }()
	}
	for a.held.Load() < disks {
		time.Sleep(5 * time.Millisecond) // both writes wait at a
	}
	current.Store(b)
	signal()
	for range disks {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("write after the move: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the writes still wait at the old primary 30 s after the move")
		}
	}
	if n := b.writes.Load(); n != disks {
		t.Errorf("the new primary got %d writes, want %d", n, disks)
	}
	// One connection per disk to a, one to b: the signal that was no move
	// dropped none.
	if n := connects.Load(); n != 2*disks {
		t.Errorf("%d connections, want %d", n, 2*disks)
	}
}

// holdErr, as a primary's failure, holds each write until its channel is
// closed (a primary cut off from its client), then abandons it.
type holdErr struct{ c chan struct{} }

func (h holdErr) Error() string { return "held" }
