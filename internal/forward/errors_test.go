package forward

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/nbdclient"
	"github.com/quiverstorage/quiver/internal/pool"
)

// TestFromErrno pins the way back from each NBD error value.
func TestFromErrno(t *testing.T) {
	for _, tc := range []struct {
		errno uint32
		want  error // nil: no domain error, only the value
	}{
		{1, pool.ErrFenced},        // EPERM
		{22, pool.ErrInvalid},      // EINVAL
		{28, pool.ErrNoSpace},      // ENOSPC
		{95, pool.ErrNotSupported}, // ENOTSUP
		{12, syscall.ENOMEM},
		{108, errConnLost}, // ESHUTDOWN: the primary drains, go to the next
		{5, nil},           // EIO
		{75, nil},          // EOVERFLOW
		{2, nil},
	} {
		got := fromErrno(tc.errno)
		if tc.want == nil {
			if want := fmt.Sprintf("primary answered NBD error %d", tc.errno); got.Error() != want {
				t.Errorf("fromErrno(%d) = %v, want %q", tc.errno, got, want)
			}
			continue
		}
		if got != tc.want {
			t.Errorf("fromErrno(%d) = %v, want %v", tc.errno, got, tc.want)
		}
	}
}

// diskExports serves one disk as export "vol/disk".
type diskExports struct{ d pool.Disk }

func (e diskExports) List(context.Context) ([]nbd.ExportInfo, error) {
	return []nbd.ExportInfo{{Name: "vol/disk"}}, nil
}

func (e diskExports) Open(context.Context, string, string) (nbd.Export, error) {
	return nbd.Export{Disk: e.d}, nil
}

// TestErrorsBothWays walks the NBD error mapping both ways, over the wire:
// the primary's disk fails a write with a domain error, its NBD server
// answers the value that error maps to, this package maps the value back,
// and a second NBD server, serving the forwarding Disk as a node that is
// not the primary does, answers the client the same value the primary
// answered.
func TestErrorsBothWays(t *testing.T) {
	s := &store{data: make([]byte, 1<<20)}
	p := startPrimary(t, s)
	d, err := Open(context.Background(), "vol/disk", func(context.Context) (string, error) { return p.addr, nil },
		Options{RequestTimeout: 5 * time.Second, RetryFor: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	via := nbd.NewServer(diskExports{d}, nbd.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	go func() { _ = via.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = via.Shutdown(ctx)
	})
	c, err := nbdclient.Dial(context.Background(), ln.Addr().String(), "vol/disk", nbdclient.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	for _, tc := range []struct {
		fail  error
		errno syscall.Errno // what both servers answer
		back  error         // what the forwarding Disk returns; nil: no domain error
	}{
		{pool.ErrReadOnly, syscall.EPERM, pool.ErrFenced},
		{pool.ErrFenced, syscall.EPERM, pool.ErrFenced},
		{fmt.Errorf("fsync: %w: %w", pool.ErrSyncFailed, syscall.EIO), syscall.EIO, nil},
		{pool.ErrDiskRemoved, syscall.EIO, nil},
		{pool.ErrOutOfRange, syscall.EINVAL, pool.ErrInvalid},
		{pool.ErrInvalid, syscall.EINVAL, pool.ErrInvalid},
		{fmt.Errorf("pwrite: %w: %w", pool.ErrNoSpace, syscall.ENOSPC), syscall.ENOSPC, pool.ErrNoSpace},
		{pool.ErrNotSupported, syscall.ENOTSUP, pool.ErrNotSupported},
		{syscall.ENOMEM, syscall.ENOMEM, syscall.ENOMEM},
		{errors.New("anything else"), syscall.EIO, nil},
	} {
		p.fail.Store(failure{tc.fail})
		err := d.WriteAt(make([]byte, 4096), 0, false)
		switch {
		case tc.back == nil && (err == nil || err.Error() != fmt.Sprintf("primary answered NBD error %d", tc.errno)):
			t.Errorf("%v: the forwarding disk returns %v, want the bare NBD error %d", tc.fail, err, tc.errno)
		case tc.back != nil && !errors.Is(err, tc.back):
			t.Errorf("%v: the forwarding disk returns %v, want %v", tc.fail, err, tc.back)
		}
		var errno nbdclient.Errno
		if err := c.WriteAt(make([]byte, 4096), 0, false); !errors.As(err, &errno) || syscall.Errno(errno) != tc.errno {
			t.Errorf("%v: the client of the forwarding node gets %v, want NBD error %d", tc.fail, err, tc.errno)
		}
	}
	p.fail.Store(failure{})
	if err := c.WriteAt(make([]byte, 4096), 0, false); err != nil {
		t.Fatalf("write once the primary is well: %v", err)
	}
}
