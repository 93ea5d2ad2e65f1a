package nbd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/pool"
)

// TestRefusalMapping walks refusalMapping both ways: every reply type has
// at most one way back, that way back maps to the same type again, and
// the types without one (NBD_REP_ERR_PLATFORM, NBD_REP_ERR_SHUTDOWN, ...)
// stand for no domain error: a forwarding node tries another server.
func TestRefusalMapping(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want uint32
	}{
		{fmt.Errorf("open: %w", pool.ErrInvalid), repErrInvalid},
		{&pool.FieldError{Field: "disk", Rule: "bad"}, repErrInvalid},
		{errNoAccess, repErrPolicy},
		{pool.ErrVolumeNotFound, repErrUnknown},
		{pool.ErrDiskNotFound, repErrUnknown},
		{pool.ErrSnapshotNotFound, repErrUnknown},
		{errors.New("etcd unreachable"), repErrPlatform},
		{&Refused{Reply: repErrShutdown, Message: "draining"}, repErrShutdown},
		{fmt.Errorf("export x: %w", &Refused{Reply: repErrPolicy, Message: "no"}), repErrPolicy},
	} {
		if got := openErrorCode(tc.err); got != tc.want {
			t.Errorf("openErrorCode(%v) = %#x, want %#x", tc.err, got, tc.want)
		}
	}
	back := map[uint32]error{repErrInvalid: pool.ErrInvalid, repErrPolicy: pool.ErrUnauthorized,
		repErrUnknown: pool.ErrVolumeNotFound}
	for _, reply := range []uint32{repErrUnsup, repErrPolicy, repErrInvalid, repErrPlatform, repErrTLSReqd,
		repErrUnknown, repErrShutdown, repErrBlockSize, repErrTooBig, repErrExtHdrReqd} {
		err := (&Refused{Reply: reply}).Unwrap()
		if err != back[reply] {
			t.Errorf("reply %#x comes back as %v, want %v", reply, err, back[reply])
		}
		if err != nil && openErrorCode(err) != reply {
			t.Errorf("reply %#x: its way back %v maps to %#x", reply, err, openErrorCode(err))
		}
	}
}

// refusingExports refuses every open with its error.
type refusingExports struct{ err error }

func (e refusingExports) List(context.Context) ([]ExportInfo, error) { return nil, e.err }
func (e refusingExports) Open(context.Context, string, string) (Export, error) {
	return Export{}, e.err
}

// TestRefusedPassedOn: an open refused with another server's refusal is
// answered with that refusal as it came, reply type and message, with
// nothing of this server's added: a client cannot tell which node it
// asked.
func TestRefusedPassedOn(t *testing.T) {
	const msg = `export "vm/root/<token>": no such export, or its attachment token is missing or wrong`
	ref := &Refused{Reply: repErrPolicy, Message: msg}
	e := newEnv(t, Config{}, func(Exports) Exports {
		return refusingExports{fmt.Errorf("export vm/root/<token>: %w", ref)}
	})
	for _, opt := range []uint32{optGo, optInfo} {
		c := dial(t, e.addr)
		c.mustGreet(clientFlagFixedNewstyle)
		reps := c.option(opt, goData("vm/root/0123"))
		if len(reps) != 1 || reps[0].typ != repErrPolicy || string(reps[0].data) != msg {
			t.Errorf("option %d: %s, want NBD_REP_ERR_POLICY %q", opt, describe(reps), msg)
		}
	}
}

// blockingExports holds every open until its context ends (or the test
// does), and says whether that context had a deadline.
type blockingExports struct {
	release  chan struct{}
	deadline chan bool
}

func (e blockingExports) List(context.Context) ([]ExportInfo, error) { return nil, nil }
func (e blockingExports) Open(ctx context.Context, _, _ string) (Export, error) {
	_, ok := ctx.Deadline()
	e.deadline <- ok
	select {
	case <-ctx.Done():
		return Export{}, fmt.Errorf("waiting for the primary: %w", ctx.Err())
	case <-e.release:
		return Export{}, errors.New("released by the test")
	}
}

// TestOpenEndsWithTheHandshake: an export's open that does not return (a
// node forwarding to a primary that does not answer) is cut short before
// the handshake deadline, and the client gets its refusal: the open holds
// no handshake slot beyond Config.HandshakeTimeout. The 10 s bound of the
// test client's reads only checks liveness; the timeout is 300 ms.
func TestOpenEndsWithTheHandshake(t *testing.T) {
	ex := blockingExports{release: make(chan struct{}), deadline: make(chan bool, 1)}
	e := newEnv(t, Config{HandshakeTimeout: 300 * time.Millisecond}, func(Exports) Exports { return ex })
	t.Cleanup(func() { close(ex.release) }) // before the server's shutdown
	c := dial(t, e.addr)
	c.mustGreet(clientFlagFixedNewstyle)
	c.sendOpt(optGo, goData(exportRoot))
	if !<-ex.deadline {
		t.Error("the open's context has no deadline")
	}
	reps, err := c.optReplies(optGo)
	if err != nil || final(reps) != repErrPlatform {
		t.Fatalf("NBD_OPT_GO with an open that does not return: %s, %v; want NBD_REP_ERR_PLATFORM", describe(reps), err)
	}
	t.Logf("refused: %s", reps[len(reps)-1].data)
}

// TestRefusalTime: an open refused for want of the export or of access is
// answered Config.RefusalTime after it began, at the soonest, whatever
// refused it: how long the check took tells the client nothing. (A lower
// bound only: the sleep makes it exact, not the machine.)
func TestRefusalTime(t *testing.T) {
	const hold = 300 * time.Millisecond
	e := newEnv(t, Config{RefusalTime: hold}, func(Exports) Exports {
		return refusingExports{fmt.Errorf("export vm/root/<token>: %w", errNoAccess)}
	})
	for _, opt := range []uint32{optGo, optInfo} {
		c := dial(t, e.addr)
		c.mustGreet(clientFlagFixedNewstyle)
		start := time.Now()
		reps := c.option(opt, goData("vm/root/0123"))
		if took := time.Since(start); final(reps) != repErrPolicy || took < hold {
			t.Errorf("option %d: %s after %v; want NBD_REP_ERR_POLICY after %v at the soonest", opt, describe(reps), took, hold)
		}
	}
}

// namingExports refuses every open for want of access, and records the
// names it was asked for.
type namingExports struct{ names chan string }

func (e namingExports) List(context.Context) ([]ExportInfo, error) { return nil, nil }
func (e namingExports) Open(_ context.Context, name, _ string) (Export, error) {
	e.names <- name
	return Export{}, errNoAccess
}

// TestForwardedRefusedAtOnce: an open that Config.Forwarded recognizes
// (another node forwards its client's open) is opened under the client's
// name, and its refusal is answered at once, naming the client's export,
// nothing of the forwarding's mark; a name that Forwarded does not
// recognize (a forged mark) is opened as it came and held RefusalTime. The
// bound of the forwarded refusal only needs the refusal not to be held: a
// loopback handshake takes far less than the second of the hold.
func TestForwardedRefusedAtOnce(t *testing.T) {
	const hold = time.Second
	ex := namingExports{names: make(chan string, 1)}
	e := newEnv(t, Config{RefusalTime: hold, Forwarded: func(name string) (string, bool) {
		return strings.CutSuffix(name, "#signed")
	}}, func(Exports) Exports { return ex })
	for _, tc := range []struct {
		name, opened string
		forwarded    bool
	}{
		{"vm/root#signed", "vm/root", true},
		{"vm/root#forged", "vm/root#forged", false},
	} {
		for _, opt := range []uint32{optGo, optInfo} {
			c := dial(t, e.addr)
			c.mustGreet(clientFlagFixedNewstyle)
			start := time.Now()
			reps := c.option(opt, goData(tc.name))
			took := time.Since(start)
			if opened := <-ex.names; opened != tc.opened {
				t.Errorf("%s, option %d: the exports were asked for %q, want %q", tc.name, opt, opened, tc.opened)
			}
			if final(reps) != repErrPolicy {
				t.Fatalf("%s, option %d: %s; want NBD_REP_ERR_POLICY", tc.name, opt, describe(reps))
			}
			msg := string(reps[len(reps)-1].data)
			if want := fmt.Sprintf("export %q", tc.opened); !strings.Contains(msg, want) || strings.Contains(msg, "#signed") {
				t.Errorf("%s, option %d: refused with %q; want it to name %s and nothing else", tc.name, opt, msg, want)
			}
			if tc.forwarded && took >= hold {
				t.Errorf("%s, option %d: refused after %v; want at once, not held %v", tc.name, opt, took, hold)
			}
			if !tc.forwarded && took < hold {
				t.Errorf("%s, option %d: refused after %v; want held %v at the soonest", tc.name, opt, took, hold)
			}
		}
	}
}
