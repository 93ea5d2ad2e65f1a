package server

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/cluster"
	"github.com/quiverstorage/quiver/internal/nbd"
	"github.com/quiverstorage/quiver/internal/pool"
)

// etcdFault fails the next etcd Txn that deletes the armed key (a
// hand-over deletes primary/<volume>) as when the connection to etcd is
// lost: after the request went through (applied) or before it was sent.
// With blackout, every key-value request fails from then on, until heal:
// etcd out of reach. It is a node's etcd client interceptor
// (cluster.Config.EtcdDialOptions).
type etcdFault struct {
	mu       sync.Mutex
	key      string
	applied  bool
	blackout bool
	dark     bool
	hits     int
}

var errLost = status.Error(codes.Unavailable, "injected: the connection to etcd was lost")

func (f *etcdFault) arm(key string, applied, blackout bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.key, f.applied, f.blackout, f.hits = key, applied, blackout, 0
}

func (f *etcdFault) heal() { f.mu.Lock(); f.dark = false; f.mu.Unlock() }

func (f *etcdFault) hit() int { f.mu.Lock(); defer f.mu.Unlock(); return f.hits }

func (f *etcdFault) option() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		f.mu.Lock()
		dark := f.dark && len(method) > len("/etcdserverpb.KV/") && method[:len("/etcdserverpb.KV/")] == "/etcdserverpb.KV/"
		fire := !dark && f.key != "" && method == "/etcdserverpb.KV/Txn" && deletesKey(req, f.key)
		applied := f.applied
		if fire {
			f.key = ""
			f.hits++
			f.dark = f.blackout
		}
		f.mu.Unlock()
		switch {
		case dark:
			return errLost
		case !fire:
			return invoker(ctx, method, req, reply, cc, opts...)
		case applied:
			if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
				return err
			}
		}
		return errLost
	})
}

func deletesKey(req any, key string) bool {
	r, ok := req.(*pb.TxnRequest)
	return ok && slices.ContainsFunc(r.Success, func(op *pb.RequestOp) bool {
		d := op.GetRequestDeleteRange()
		return d != nil && string(d.Key) == key
	})
}

// testNode is a cluster node of a test: its pool, served over NBD on
// loopback for its primaries, and its etcd client's fault injector.
type testNode struct {
	node  *cluster.Node
	pool  *pool.Pool
	fault *etcdFault
}

// startNodes starts two nodes on loopback: n1 with an embedded etcd
// member, n2 on it.
func startNodes(t *testing.T) map[string]*testNode {
	t.Helper()
	dir := t.TempDir()
	log := quietLogger()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte("0123456789abcdef-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	peerAddr, clientAddr := freePort(t), freePort(t)
	out := map[string]*testNode{}
	for _, name := range []string{"n1", "n2"} {
		p, err := pool.Init(context.Background(), filepath.Join(dir, name), log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := nbd.NewServer(nbd.PoolExports{Pool: p}, nbd.Config{Logger: log})
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(ctx)
		})
		fault := &etcdFault{}
		cfg := cluster.Config{NodeName: name, ClusterName: "alpha", TokenFile: tokenFile,
			StateDir: filepath.Join(dir, name+"-state"), APIAddr: "127.0.0.1:1", NBDAddr: l.Addr().String(),
			LeaseTTL: 2 * time.Second, DialTimeout: 5 * time.Second, StartTimeout: 30 * time.Second,
			OpTimeout: 10 * time.Second, Logger: log, EtcdDialOptions: []grpc.DialOption{fault.option()}}
		if name == "n1" {
			cfg.InitialCluster = "n1=http://" + peerAddr
			cfg.EtcdClientURLs = []string{"http://" + clientAddr}
		} else {
			cfg.EtcdEndpoints = []string{"http://" + clientAddr}
		}
		node, err := cluster.Join(context.Background(), cfg, poolStore{p})
		if err != nil {
			t.Fatalf("join %s: %v", name, err)
		}
		t.Cleanup(func() { _ = node.Close() })
		p.SetAttachmentsHook(node.PublishAttachments)
		out[name] = &testNode{node: node, pool: p, fault: fault}
	}
	return out
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestHandOverUnknownOutcome (issue 29): the primary freezes the volume's
// Sets, records the hand-over in etcd and retires the Sets. When that
// transaction's answer is lost, the old primary acknowledges a write
// afterwards only if etcd shows it still the primary:
//
//   - lost before it reached etcd: etcd shows the old primary still at its
//     term; HandOver fails and the write is acknowledged;
//   - applied, its answer lost, and etcd out of reach until the hand-over
//     gives up: HandOver fails, and the write is abandoned (nbd.ErrAbandon),
//     never acknowledged; etcd, back, shows the new primary;
//   - applied, its answer lost, etcd in reach: HandOver reads that it
//     applied and succeeds; the write is abandoned.
func TestHandOverUnknownOutcome(t *testing.T) {
	nodes := startNodes(t)
	ctx := context.Background()
	never := func(bool, string) bool { return false }
	buf := make([]byte, 4096)

	// open creates volume, waits until its primary holds it with the other
	// copy in sync at term 1, and opens its disk there as a client would.
	open := func(volume string) (*testNode, *replicaSets, nbd.Export, string) {
		t.Helper()
		spec := api.VolumeSpec{Name: volume, Capacity: 4 << 20, Replicas: 2, Disks: []api.DiskSpec{{Name: "d0", Size: 4 << 20}}}
		p, _, err := nodes["n1"].node.CreateVolume(ctx, spec, "", never)
		if err != nil {
			t.Fatal(err)
		}
		prim := nodes[p.Primary]
		waitUntil(t, p.Primary+" holding "+volume+" with its copy in sync at term 1", func() bool {
			if _, err := prim.node.HoldPrimary(ctx, volume); err != nil {
				return false
			}
			r, err := prim.node.Role(ctx, volume)
			return err == nil && len(r.Targets) == 1 && r.Targets[0].Token != "" && r.Targets[0].Term == 1 &&
				r.Targets[0].NBD != ""
		})
		sets := newReplicaSets(prim.node, prim.pool, quietLogger(), newReplMetrics(), cluster.Config{}, nil)
		ex, err := replicatedExports{Exports: nbd.PoolExports{Pool: prim.pool}, node: prim.node, log: quietLogger(),
			sets: sets}.Open(ctx, volume+"/d0", "test")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ex.Disk.Close() })
		if err := ex.Disk.WriteAt(buf, 0, true); err != nil {
			t.Fatalf("write before the hand-over: %v", err)
		}
		return prim, sets, ex, "/quiver/primary/" + volume
	}
	primaryOf := func(volume string) (string, uint64) {
		p, _, err := nodes["n1"].node.Placement(ctx, volume)
		if err != nil {
			t.Fatal(err)
		}
		return p.Primary, p.Term
	}

	// Lost before it reached etcd.
	prim, sets, ex, pk := open("lost")
	prim.fault.arm(pk, false, false)
	_, err := sets.HandOver(ctx, "lost")
	if prim.fault.hit() != 1 || err == nil {
		t.Fatalf("hand-over lost before etcd: %v (fault fired %d times), want an error", err, prim.fault.hit())
	}
	if who, term := primaryOf("lost"); who != prim.node.Name() || term != 1 {
		t.Fatalf("etcd shows %s at term %d, want %s still at term 1", who, term, prim.node.Name())
	}
	if err := ex.Disk.WriteAt(buf, 4096, true); err != nil {
		t.Fatalf("write on the primary etcd still shows: %v", err)
	}

	// Applied, its answer lost, etcd out of reach.
	prim, sets, ex, pk = open("dark")
	prim.fault.arm(pk, true, true)
	hctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = sets.HandOver(hctx, "dark")
	cancel()
	if prim.fault.hit() != 1 || !errors.Is(err, cluster.ErrUnknownOutcome) {
		t.Fatalf("hand-over applied with etcd out of reach: %v (fault fired %d times), want ErrUnknownOutcome", err,
			prim.fault.hit())
	}
	werr := ex.Disk.WriteAt(buf, 4096, true)
	prim.fault.heal()
	if who, term := primaryOf("dark"); who == prim.node.Name() || term != 2 {
		t.Fatalf("etcd shows %s at term %d, want the other node at term 2", who, term)
	}
	if !errors.Is(werr, nbd.ErrAbandon) {
		t.Fatalf("write after a hand-over of unknown outcome, which applied: %v, want it abandoned", werr)
	}

	// Applied, its answer lost, etcd in reach.
	prim, sets, ex, pk = open("applied")
	prim.fault.arm(pk, true, false)
	to, err := sets.HandOver(ctx, "applied")
	if prim.fault.hit() != 1 || err != nil || to == prim.node.Name() {
		t.Fatalf("hand-over applied with its answer lost: %q, %v (fault fired %d times)", to, err, prim.fault.hit())
	}
	if who, term := primaryOf("applied"); who != to || term != 2 {
		t.Fatalf("etcd shows %s at term %d, want %s at term 2", who, term, to)
	}
	if err := ex.Disk.WriteAt(buf, 4096, true); !errors.Is(err, nbd.ErrAbandon) {
		t.Fatalf("write after the hand-over: %v, want it abandoned", err)
	}
}
