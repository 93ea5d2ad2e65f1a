package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/raft/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quiverstorage/quiver/internal/api"
)

// TestClassifyTxn: what each error of a Commit says of the transaction.
// Only what etcd (or the client) answers before the request can enter
// etcd's log is known not applied; anything else is unknown.
func TestClassifyTxn(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want txnOutcome
	}{
		{"answered", nil, txnDone},
		{"no leader", rpctypes.ErrNoLeader, txnRetry},
		{"not leader", rpctypes.ErrNotLeader, txnRetry},
		{"leader changed (read path)", rpctypes.ErrLeaderChanged, txnRetry},
		{"too many requests", rpctypes.ErrTooManyRequests, txnRetry},
		{"no connection to send on", status.Error(codes.Unavailable, "there is no connection available"), txnRetry},
		{"no address", status.Error(codes.Unavailable, "there is no address available"), txnRetry},
		{"proposal dropped", status.Error(codes.Unknown, raft.ErrProposalDropped.Error()), txnRetry},
		{"wrapped no leader", fmt.Errorf("mark: %w", rpctypes.ErrNoLeader), txnRetry},
		{"lease not found", rpctypes.ErrLeaseNotFound, txnRefused},
		{"request too large", rpctypes.ErrRequestTooLarge, txnRefused},
		{"no space", rpctypes.ErrNoSpace, txnRefused},
		{"permission denied", rpctypes.ErrPermissionDenied, txnRefused},
		{"invalid auth token", rpctypes.ErrInvalidAuthToken, txnRefused},
		{"duplicate key", rpctypes.ErrDuplicateKey, txnRefused},
		{"compacted", rpctypes.ErrCompacted, txnRefused},
		{"request timed out", rpctypes.ErrTimeout, txnUnknown},
		{"timed out, leader failed", rpctypes.ErrTimeoutDueToLeaderFail, txnUnknown},
		{"timed out, connection lost", rpctypes.ErrTimeoutDueToConnectionLost, txnUnknown},
		{"server stopped", rpctypes.ErrStopped, txnUnknown},
		{"server-side deadline", rpctypes.Error(rpctypes.ErrGRPCDeadlineExceeded), txnUnknown},
		{"server-side cancel", rpctypes.Error(rpctypes.ErrGRPCCanceled), txnUnknown},
		{"client deadline", context.DeadlineExceeded, txnUnknown},
		{"client cancel", fmt.Errorf("txn: %w", context.Canceled), txnUnknown},
		{"connection closed after sending", status.Error(codes.Unavailable, "error reading from server: EOF"), txnUnknown},
		{"transport closing", status.Error(codes.Unavailable, "transport is closing"), txnUnknown},
		{"response too large for the client", status.Error(codes.ResourceExhausted, "grpc: received message larger than max"), txnUnknown},
		{"client connection closing", status.Error(codes.Canceled, "grpc: the client connection is closing"), txnUnknown},
		{"anything else", errors.New("something"), txnUnknown},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := classifyTxn(c.err); got != c.want {
				t.Fatalf("classifyTxn(%v) = %s, want %s", c.err, got, c.want)
			}
		})
	}
}

// txnFault fails the next etcd Txn that deletes the armed key (armPut:
// that puts it), as when the connection to etcd is lost: after the request
// went through (applied) or before it was sent; armPut may give another
// error. It is the etcd client's interceptor (Config.EtcdDialOptions).
type txnFault struct {
	mu      sync.Mutex
	key     string
	put     bool
	applied bool
	err     error
	hits    int
	// sticky: the fault fires on every such Txn until disarmed.
	sticky bool
}

// armSticky fails every Txn that puts key, not applied, until disarm.
func (f *txnFault) armSticky(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.key, f.put, f.applied, f.err, f.sticky = key, true, false, nil, true
}

func (f *txnFault) disarm() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.key, f.sticky = "", false
}

func (f *txnFault) arm(key string, applied bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.key, f.put, f.applied, f.err = key, false, applied, nil
}

// armPut fails the next Txn that puts key with err (nil: the connection
// lost).
func (f *txnFault) armPut(key string, applied bool, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.key, f.put, f.applied, f.err = key, true, applied, err
}

func (f *txnFault) hit() int { f.mu.Lock(); defer f.mu.Unlock(); return f.hits }

func (f *txnFault) option() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		f.mu.Lock()
		fire := f.key != "" && method == "/etcdserverpb.KV/Txn" &&
			(f.put && txnPuts(req, f.key) || !f.put && txnDeletes(req, f.key))
		applied, ferr := f.applied, f.err
		if fire {
			if !f.sticky {
				f.key = ""
			}
			f.hits++
		}
		f.mu.Unlock()
		if !fire {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		if applied {
			if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
				return err
			}
		}
		if ferr != nil {
			return ferr
		}
		return status.Error(codes.Unavailable, "injected: the connection to etcd was lost")
	})
}

func txnPuts(req any, key string) bool {
	r, ok := req.(*pb.TxnRequest)
	if !ok {
		return false
	}
	return slices.ContainsFunc(r.Success, func(op *pb.RequestOp) bool {
		if t := op.GetRequestTxn(); t != nil {
			return txnPuts(t, key) // a Txn within the Txn (BeginIntent's)
		}
		p := op.GetRequestPut()
		return p != nil && string(p.Key) == key
	})
}

func txnDeletes(req any, key string) bool {
	r, ok := req.(*pb.TxnRequest)
	if !ok {
		return false
	}
	return slices.ContainsFunc(r.Success, func(op *pb.RequestOp) bool {
		d := op.GetRequestDeleteRange()
		return d != nil && string(d.Key) == key
	})
}

// TestHandOverUnknownOutcome (issue 29): a hand-over whose transaction has
// an unknown outcome is settled by reading etcd. Lost before it reached
// etcd, it is refused with an error that is neither ErrNotPrimary nor
// ErrUnknownOutcome, the record still naming the old primary at its term
// and rewritten so that the lost request can never apply; applied with its
// answer lost, it is reported handed over, as etcd shows it.
func TestHandOverUnknownOutcome(t *testing.T) {
	tc := startCluster(t)
	fault := &txnFault{}
	cfg := tc.config(t, "n2")
	cfg.EtcdDialOptions = []grpc.DialOption{fault.option()}
	st := newMemStore()
	st.free = 90 << 30 // placed first: the primary
	n2 := tc.join(t, cfg, st)
	n1 := tc.first
	ctx := context.Background()
	never := func(bool, string) bool { return false }
	p, _, err := n1.Volumes().CreateVolume(ctx, api.VolumeSpec{Name: "v", Capacity: 1 << 30, Replicas: 2}, "", never)
	if err != nil || p.Primary != "n2" {
		t.Fatalf("create: %+v, %v; want n2 the primary", p, err)
	}
	waitFor(t, "n2 holding primary/v with n1 in sync at term 1", func() bool {
		if _, err := n2.Primaries().HoldPrimaryKey(ctx, "v"); err != nil {
			return false
		}
		r, err := n2.Primaries().Role(ctx, "v")
		return err == nil && len(r.Targets) == 1 && r.Targets[0].Instance != "" && r.Targets[0].Term == 1
	})
	pk := n2.key("primary", "v")

	rev := func() int64 {
		resp, err := n1.cli.Get(ctx, n1.key("volumes", "v"))
		if err != nil || len(resp.Kvs) == 0 {
			t.Fatalf("volume record: %v", err)
		}
		return resp.Kvs[0].ModRevision
	}
	before := rev()
	fault.arm(pk, false)
	_, _, err = n2.Primaries().HandOver(ctx, "v", 1)
	if fault.hit() != 1 {
		t.Fatalf("the fault did not fire: %v", err)
	}
	if err == nil || errors.Is(err, ErrNotPrimary) || errors.Is(err, ErrUnknownOutcome) {
		t.Fatalf("hand-over lost before etcd: %v, want a plain refusal (still the primary)", err)
	}
	if rec := n1.record(t, "v"); rec.Primary != "n2" || rec.Term != 1 || !slices.Contains(rec.Copies, "n2") {
		t.Fatalf("after a hand-over that did not apply: %+v", rec)
	}
	if rev() == before {
		t.Fatal("the volume record was not written again: the lost hand-over could still apply")
	}
	t.Logf("refused: %v", err)

	waitFor(t, "n2 holding primary/v", func() bool { _, err := n2.Primaries().HoldPrimaryKey(ctx, "v"); return err == nil })
	fault.arm(pk, true)
	to, term, err := n2.Primaries().HandOver(ctx, "v", 1)
	if fault.hit() != 2 {
		t.Fatalf("the fault did not fire: %v", err)
	}
	if err != nil || to != "n1" || term != 2 {
		t.Fatalf("hand-over applied with its answer lost: %s %d %v, want n1 at term 2", to, term, err)
	}
	if rec := n1.record(t, "v"); rec.Primary != "n1" || rec.Term != 2 || slices.Contains(rec.Copies, "n2") {
		t.Fatalf("after the hand-over: %+v", rec)
	}
}
