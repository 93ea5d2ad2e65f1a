package nbd

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"syscall"
	"testing"

	"github.com/quiverstorage/quiver/internal/pool"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// requireToken makes the test server's exports require tokens.
func requireToken(x Exports) Exports {
	pe := x.(PoolExports)
	pe.RequireToken = true
	return pe
}

// TestTokenNeverEchoed: whatever shape an export name has, the token part
// reaches neither the client (option replies) nor the log, at debug level.
func TestTokenNeverEchoed(t *testing.T) {
	logs := &testserver.LogBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	for _, require := range []bool{false, true} {
		wrap := func(x Exports) Exports { return x }
		if require {
			wrap = requireToken
		}
		e := newEnv(t, Config{Logger: log}, wrap)
		_, real := e.attachToken("node", "ro")
		for _, tok := range []string{real, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"} {
			for _, name := range []string{
				"vx@/root/" + tok, "vm@/root/" + tok, "nosuch/root/" + tok, "vm/nosuch/" + tok,
				"vm@nosnap/root/" + tok, "vm/root/" + tok + "/more", "/root/" + tok, "vm//" + tok,
				"vm/root/" + tok,
			} {
				for _, opt := range []uint32{optInfo, optGo} {
					c := dial(t, e.addr)
					c.strict = false
					c.mustGreet(clientFlagFixedNewstyle)
					for _, r := range c.option(opt, goData(name, infoName, infoDescription)) {
						if bytes.Contains(r.data, []byte(tok)) {
							t.Errorf("require %v, option %d for %q: reply %#x carries the token: %q", require, opt, name, r.typ, r.data)
						}
					}
					_ = c.nc.Close()
				}
				c := dial(t, e.addr)
				c.mustGreet(clientFlagFixedNewstyle)
				c.sendOpt(optExportName, []byte(name))
				b := make([]byte, 256)
				n, _ := c.r.Read(b)
				if bytes.Contains(b[:n], []byte(tok)) {
					t.Errorf("EXPORT_NAME %q: the server sent the token back", name)
				}
				_ = c.nc.Close()
			}
		}
		e.waitIdle()
		if strings.Contains(logs.String(), real) {
			t.Errorf("require %v: the log holds a token:\n%s", require, logs.String())
		}
	}
	if strings.Contains(logs.String(), "0123456789abcdef0123456789abcdef") {
		t.Errorf("the log holds a token:\n%s", logs.String())
	}
}

// TestUnknownVolumeLooksLikeBadToken: when tokens are required, a client
// without a valid token learns nothing about which volumes exist: an
// unknown volume, a missing token and a wrong one get the same reply.
func TestUnknownVolumeLooksLikeBadToken(t *testing.T) {
	e := newEnv(t, Config{}, requireToken)
	_, tok := e.attachToken("node", "rw")
	var want string
	for _, name := range []string{
		"nosuch/root", "vm/root", "vm/root/badtoken", "nosuch/root/" + tok, "vm@snap/root", "vm@nosnap/root/badtoken",
	} {
		c := dial(t, e.addr)
		c.mustGreet(clientFlagFixedNewstyle)
		reps := c.option(optGo, goData(name))
		if got := final(reps); got != repErrPolicy {
			t.Errorf("GO %q: reply %#x, want ERR_POLICY", name, got)
			continue
		}
		msg := strings.Replace(string(reps[len(reps)-1].data), RedactToken(name), "NAME", 1)
		if want == "" {
			want = msg
		} else if msg != want {
			t.Errorf("GO %q: message %q differs from %q", name, msg, want)
		}
	}
	// With a valid token, the client learns what its attachment may see.
	c := dial(t, e.addr)
	c.mustGreet(clientFlagFixedNewstyle)
	if got := final(c.option(optGo, goData("vm/nosuch/"+tok))); got != repErrUnknown {
		t.Errorf("GO of an unknown disk with a valid token: %#x, want ERR_UNKNOWN", got)
	}
}

// failingExports makes every ReadAt fail with err.
type failingExports struct {
	Exports
	err error
}

type failingDisk struct {
	countingDisk
	err error
}

func (x failingExports) Open(ctx context.Context, name, peer string) (Export, error) {
	ex, err := x.Exports.Open(ctx, name, peer)
	if err == nil {
		ex.Disk = failingDisk{countingDisk: countingDisk{Disk: ex.Disk}, err: x.err}
	}
	return ex, err
}

func (d failingDisk) ReadAt(p []byte, off int64) error { return d.err }

// TestDataErrorsWarn: a READ that fails on the disk is counted and logged at
// warn, with the pace of the failure log (ten at once), not once per request.
func TestDataErrorsWarn(t *testing.T) {
	for _, tc := range []struct {
		err   error
		errno uint32
		name  string
	}{
		{syscall.EIO, errIO, "EIO"},
		{fmt.Errorf("%w: %w", pool.ErrNoSpace, syscall.ENOSPC), errNoSpc, "ENOSPC"}, // classified, as the storage layer returns it
	} {
		t.Run(tc.name, func(t *testing.T) {
			logs := &testserver.LogBuffer{}
			obs := newRecorder()
			e := newEnv(t, Config{Observer: obs, Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))},
				func(x Exports) Exports { return failingExports{Exports: x, err: tc.err} })
			c := e.connect(t, hsOpts{export: exportRoot})
			const n = 30
			for range n {
				if rep := c.do(testReq{typ: cmdRead, length: 4096}); rep.errno != tc.errno {
					t.Fatalf("READ: errno %d, want %d", rep.errno, tc.errno)
				}
			}
			if got := obs.count(obs.errors, tc.name); got != n {
				t.Errorf("%d data errors counted, want %d", got, n)
			}
			warns := strings.Count(logs.String(), "level=WARN msg=\"request failed on the disk\"")
			if warns < 1 || warns > 12 {
				t.Errorf("%d warnings for %d failures, want between 1 and 12 (paced):\n%s", warns, n, logs.String())
			}
		})
	}
}
