package replicated

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
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
	"github.com/quiverstorage/quiver/internal/replica"
)

// etcdFault fails the next etcd Txn that the armed match picks (a
// hand-over deletes primary/<volume>) as when the connection to etcd is
// lost: after the request went through (applied) or before it was sent.
// With blackout, every key-value request fails from then on, until heal:
// etcd out of reach. It is a node's etcd client interceptor
// (cluster.Config.EtcdDialOptions).
type etcdFault struct {
	mu       sync.Mutex
	match    func(*pb.TxnRequest) bool
	applied  bool
	blackout bool
	dark     bool
	hits     int
}

var errLost = status.Error(codes.Unavailable, "injected: the connection to etcd was lost")

func (f *etcdFault) arm(match func(*pb.TxnRequest) bool, applied, blackout bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.match, f.applied, f.blackout, f.hits = match, applied, blackout, 0
}

func (f *etcdFault) heal() { f.mu.Lock(); f.dark = false; f.mu.Unlock() }

func (f *etcdFault) hit() int { f.mu.Lock(); defer f.mu.Unlock(); return f.hits }

func (f *etcdFault) option() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		f.mu.Lock()
		dark := f.dark && len(method) > len("/etcdserverpb.KV/") && method[:len("/etcdserverpb.KV/")] == "/etcdserverpb.KV/"
		r, isTxn := req.(*pb.TxnRequest)
		fire := !dark && f.match != nil && isTxn && f.match(r)
		applied := f.applied
		if fire {
			f.match = nil
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

// deletes picks a Txn that deletes key.
func deletes(key string) func(*pb.TxnRequest) bool {
	return func(r *pb.TxnRequest) bool {
		return slices.ContainsFunc(r.Success, func(op *pb.RequestOp) bool {
			d := op.GetRequestDeleteRange()
			return d != nil && string(d.Key) == key
		})
	}
}

// putsOnly picks a Txn that puts key and nothing else.
func putsOnly(key string) func(*pb.TxnRequest) bool {
	return func(r *pb.TxnRequest) bool {
		return len(r.Success) == 1 && r.Success[0].GetRequestPut() != nil && string(r.Success[0].GetRequestPut().Key) == key
	}
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
		// The node's exports, as server.Run makes them once it joined:
		// a copy accepts its primary's replication sessions.
		exports := &lateExports{}
		srv := nbd.NewServer(exports, nbd.Config{Logger: log})
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
		for try := 1; err != nil && name == "n1" && try < 5 && strings.Contains(err.Error(), "address already in use"); try++ {
			// The ports were free a moment ago; another test package
			// running meanwhile took one: again, with others.
			peerAddr, clientAddr = freePort(t), freePort(t)
			cfg.InitialCluster, cfg.EtcdClientURLs = "n1=http://"+peerAddr, []string{"http://" + clientAddr}
			cfg.StateDir = filepath.Join(dir, fmt.Sprintf("%s-state-%d", name, try))
			node, err = cluster.Join(context.Background(), cfg, poolStore{p})
		}
		if err != nil {
			t.Fatalf("join %s: %v", name, err)
		}
		t.Cleanup(func() { _ = node.Close() })
		p.SetAttachmentsHook(node.Primaries().PublishAttachments)
		exports.set(Exports{Exports: nbd.PoolExports{Pool: p}, node: node, log: log,
			sets: newReplicaSets(node, p, log, newReplMetrics(), cluster.Config{}, nil), sessions: replica.NewSessions(), pool: p})
		out[name] = &testNode{node: node, pool: p, fault: fault}
	}
	return out
}

// placeVolume creates a volume of two copies of one 4 MiB disk, and waits
// until its primary holds it with the other copy in sync at term 1. It
// returns the primary and the other copy's node.
func placeVolume(t *testing.T, nodes map[string]*testNode, volume string) (*testNode, string) {
	t.Helper()
	ctx := context.Background()
	never := func(bool, string) bool { return false }
	spec := api.VolumeSpec{Name: volume, Capacity: 4 << 20, Replicas: 2, Disks: []api.DiskSpec{{Name: "d0", Size: 4 << 20}}}
	p, _, err := nodes["n1"].node.Volumes().CreateVolume(ctx, spec, "", never)
	if err != nil {
		t.Fatal(err)
	}
	prim := nodes[p.Primary]
	var other string
	waitUntil(t, p.Primary+" holding "+volume+" with its copy in sync at term 1", func() bool {
		if _, err := prim.node.Primaries().HoldPrimary(ctx, volume); err != nil {
			return false
		}
		r, err := prim.node.Primaries().Role(ctx, volume)
		if err != nil || len(r.Targets) != 1 {
			return false
		}
		other = r.Targets[0].Node
		return r.Targets[0].Instance != "" && r.Targets[0].Term == 1 && r.Targets[0].NBD != ""
	})
	return prim, other
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

// lateExports are a node's exports, set once the node joined its cluster.
type lateExports struct {
	mu sync.Mutex
	ex nbd.Exports
}

func (l *lateExports) set(ex nbd.Exports) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ex = ex
}

func (l *lateExports) get() (nbd.Exports, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ex == nil {
		return nil, errors.New("the node has not joined yet")
	}
	return l.ex, nil
}

func (l *lateExports) List(ctx context.Context) ([]nbd.ExportInfo, error) {
	ex, err := l.get()
	if err != nil {
		return nil, err
	}
	return ex.List(ctx)
}

func (l *lateExports) Open(ctx context.Context, name, peer string) (nbd.Export, error) {
	ex, err := l.get()
	if err != nil {
		return nbd.Export{}, err
	}
	return ex.Open(ctx, name, peer)
}
