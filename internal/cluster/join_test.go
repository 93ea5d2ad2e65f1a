package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
)

// memStore is a pool in memory: volumes by name with their UIDs.
type memStore struct {
	free    int64             // free bytes reported (0: 50 GiB)
	adopted map[string]string // attachment state adopted, by volume
	id      string
	mu      sync.Mutex
	vols    map[string]string
	clones  map[string]string // the source of each clone, by name
	failErr error             // CreateCopy and DeleteCopy fail with it when set
	// attached: the attachments made for a primary, "<volume>/<primary>/<term>"
	attached map[string]bool
}

func newMemStore() *memStore { return &memStore{id: newID(), vols: map[string]string{}} }

func (s *memStore) PoolID() string { return s.id }
func (s *memStore) Usage() (int64, int64, error) {
	if s.free != 0 {
		return 100 << 30, s.free, nil
	}
	return 100 << 30, 50 << 30, nil
}
func (s *memStore) has(name string) bool { s.mu.Lock(); defer s.mu.Unlock(); return s.vols[name] != "" }
func (s *memStore) setFail(err error)    { s.mu.Lock(); s.failErr = err; s.mu.Unlock() }
func (s *memStore) CreateCopy(_ context.Context, spec api.VolumeSpec) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failErr != nil {
		return "", s.failErr
	}
	if s.vols[spec.Name] != "" {
		return "", fmt.Errorf("volume %q already exists", spec.Name)
	}
	s.vols[spec.Name] = newID()
	return s.vols[spec.Name], nil
}

func (s *memStore) LocalCopies() []LocalCopy {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []LocalCopy
	for name, uid := range s.vols {
		out = append(out, LocalCopy{Name: name, UID: uid, Replicas: 2})
	}
	return out
}

func (s *memStore) DeleteCopy(_ context.Context, name, uid string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failErr != nil {
		return s.failErr
	}
	if s.vols[name] == uid {
		delete(s.vols, name)
	}
	return nil
}

// freePort returns a loopback port nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// testCluster is one node with an embedded single-member etcd, which other
// nodes reach as external etcd.
type testCluster struct {
	dir      string
	endpoint string
	token    string
	first    *Node
	// firstStore is first's store.
	firstStore *memStore
}

func writeToken(t *testing.T, dir, token string) string {
	t.Helper()
	f := filepath.Join(dir, "token-"+newID())
	if err := os.WriteFile(f, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

func startCluster(t *testing.T) *testCluster {
	t.Helper()
	dir := t.TempDir()
	tc := &testCluster{dir: dir, token: "0123456789abcdef-secret"}
	tokenFile := writeToken(t, dir, tc.token)
	var n *Node
	for try := 0; ; try++ {
		// The ports were free a moment ago; another test package running
		// meanwhile may have taken one: then again, with others.
		peer, client := freePort(t), freePort(t)
		tc.endpoint = fmt.Sprintf("http://127.0.0.1:%d", client)
		cfg := Config{NodeName: "n1", ClusterName: "alpha", TokenFile: tokenFile,
			InitialCluster: fmt.Sprintf("n1=http://127.0.0.1:%d", peer), EtcdClientURLs: []string{tc.endpoint},
			StateDir: filepath.Join(dir, fmt.Sprintf("n1-%d", try)), APIAddr: "127.0.0.1:1", LeaseTTL: 2 * time.Second,
			StartTimeout: 30 * time.Second, OpTimeout: 10 * time.Second, Logger: testLogger(t)}
		tc.firstStore = newMemStore()
		var err error
		if n, err = Join(context.Background(), cfg, tc.firstStore); err == nil {
			break
		}
		if try == 4 || !strings.Contains(err.Error(), "address already in use") {
			t.Fatalf("first node: %v", err)
		}
	}
	t.Cleanup(func() { _ = n.Close() })
	tc.first = n
	return tc
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// config is a node of the cluster on external etcd.
func (tc *testCluster) config(t *testing.T, name string) Config {
	return Config{NodeName: name, ClusterName: "alpha", TokenFile: writeToken(t, tc.dir, tc.token),
		EtcdEndpoints: []string{tc.endpoint}, StateDir: filepath.Join(tc.dir, name+"-"+newID()),
		APIAddr: "127.0.0.1:2", LeaseTTL: 2 * time.Second, DialTimeout: 3 * time.Second, OpTimeout: 10 * time.Second,
		Logger: testLogger(t)}
}

func (tc *testCluster) join(t *testing.T, cfg Config, s Store) *Node {
	t.Helper()
	n, err := Join(context.Background(), cfg, s)
	if err != nil {
		t.Fatalf("join %s: %v", cfg.NodeName, err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

func TestJoinRefusals(t *testing.T) {
	tc := startCluster(t)
	ok := tc.config(t, "n2")
	tc.join(t, ok, newMemStore())

	for _, c := range []struct {
		name   string
		change func(*Config)
		want   error
	}{
		{"a taken node name", func(c *Config) { c.NodeName = "n1" }, ErrNameTaken},
		{"another cluster", func(c *Config) { c.ClusterName = "beta" }, ErrOtherCluster},
		{"a wrong token", func(c *Config) { c.TokenFile = writeToken(t, tc.dir, "another-token-of-16+") }, ErrWrongToken},
		{"etcd unreachable", func(c *Config) {
			c.EtcdEndpoints = []string{fmt.Sprintf("http://127.0.0.1:%d", freePort(t))}
			c.DialTimeout = time.Second
		}, ErrUnreachable},
		{"no cluster name", func(c *Config) { c.ClusterName = "" }, ErrConfig},
		{"both etcd modes", func(c *Config) { c.InitialCluster = "n3=http://127.0.0.1:1" }, ErrConfig},
		{"a short token", func(c *Config) { c.TokenFile = writeToken(t, tc.dir, "short") }, ErrConfig},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := tc.config(t, "n3")
			c.change(&cfg)
			n, err := Join(context.Background(), cfg, newMemStore())
			if err == nil {
				_ = n.Close()
				t.Fatal("joined")
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			t.Logf("refused: %v", err)
		})
	}
	nodes, err := tc.first.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ni := range nodes {
		names = append(names, ni.Name)
	}
	if !slices.Equal(names, []string{"n1", "n2"}) {
		t.Fatalf("members after the refusals = %v, want n1 n2", names)
	}
}

func TestRestartKeepsIdentity(t *testing.T) {
	tc := startCluster(t)
	cfg := tc.config(t, "n2")
	s := newMemStore()
	n := tc.join(t, cfg, s)
	// A clean stop revokes the lease: the node is down at once, and the
	// same pool comes back as the same node.
	_ = n.Close()
	nodes, _ := tc.first.Nodes(context.Background())
	if i := slices.IndexFunc(nodes, func(ni NodeInfo) bool { return ni.Name == "n2" }); i < 0 || nodes[i].Up {
		t.Fatalf("after close: %+v", nodes)
	}
	tc.join(t, cfg, s)
	// The pool is n2's: another name on it is refused, and so is another
	// cluster name.
	other := cfg
	other.NodeName = "n9"
	if _, err := Join(context.Background(), other, s); !errors.Is(err, ErrConfig) {
		t.Fatalf("another name on n2's pool: %v", err)
	}
	other = cfg
	other.ClusterName = "beta"
	if _, err := Join(context.Background(), other, s); !errors.Is(err, ErrOtherCluster) {
		t.Fatalf("another cluster on n2's pool: %v", err)
	}
}

func TestPlacement(t *testing.T) {
	tc := startCluster(t)
	stores := map[string]*memStore{}
	for _, name := range []string{"n2", "n3"} {
		stores[name] = newMemStore()
		tc.join(t, tc.config(t, name), stores[name])
	}
	ctx := context.Background()
	never := func(bool, string) bool { return false }
	spec := api.VolumeSpec{Name: "web01", Capacity: 1 << 30, Replicas: 2}
	p, created, err := tc.first.Volumes().CreateVolume(ctx, spec, "", never)
	if err != nil || !created {
		t.Fatalf("create: %v %v", created, err)
	}
	// n1's store is the first node's: every node reports the same free
	// space, so the two are the first by name.
	if len(p.Copies) != 2 || p.Primary != p.Copies[0].Node || p.Term != 1 {
		t.Fatalf("placement %+v", p)
	}
	for _, c := range p.Copies {
		if c.State != CopyInSync {
			t.Fatalf("copy %+v not in sync", c)
		}
	}
	if p.Copies[0].Node == p.Copies[1].Node {
		t.Fatalf("two copies on one node: %+v", p)
	}
	if _, _, err := tc.first.Volumes().CreateVolume(ctx, spec, "", never); !errors.Is(err, ErrVolumeExists) {
		t.Fatalf("second create: %v", err)
	}
	big := api.VolumeSpec{Name: "big", Capacity: 1 << 30, Replicas: 4}
	if _, _, err := tc.first.Volumes().CreateVolume(ctx, big, "", never); !errors.Is(err, ErrNotEnoughNodes) {
		t.Fatalf("replicas 4 of 3 nodes: %v", err)
	}
	if _, ok, _ := tc.first.Volumes().Placement(ctx, "big"); ok {
		t.Fatal("a refused volume was recorded")
	}
	// A copy that cannot be made fails the create, and the other copies
	// are removed.
	stores["n2"].setFail(errors.New("disk on fire"))
	all := api.VolumeSpec{Name: "all", Capacity: 1 << 30, Replicas: 3}
	if _, _, err := tc.first.Volumes().CreateVolume(ctx, all, "", never); !errors.Is(err, ErrCopyFailed) {
		t.Fatalf("create with a failing copy: %v", err)
	}
	if _, ok, _ := tc.first.Volumes().Placement(ctx, "all"); ok || stores["n3"].has("all") {
		t.Fatal("a failed create left its placement or a copy")
	}
	stores["n2"].setFail(nil)
	if err := tc.first.Volumes().DeleteVolume(ctx, "web01"); err != nil {
		t.Fatal(err)
	}
	for name, s := range stores {
		if s.has("web01") {
			t.Fatalf("%s still holds web01", name)
		}
	}
	if _, ok, _ := tc.first.Volumes().Placement(ctx, "web01"); ok {
		t.Fatal("placement left after delete")
	}
	if err := tc.first.Volumes().DeleteVolume(ctx, "web01"); !errors.Is(err, ErrVolumeNotFound) {
		t.Fatalf("second delete: %v", err)
	}
}

func (s *memStore) ActivityOf(volume, uid string, term uint64) *CopyActivity { return nil }

func (s *memStore) AttachForPrimary(_ context.Context, volume, primary string, term uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.attached == nil {
		s.attached = map[string]bool{}
	}
	s.attached[fmt.Sprintf("%s/%s/%d", volume, primary, term)] = true
	return nil
}

// hasAttached says whether the store made its attachment for primary at
// term.
func (s *memStore) hasAttached(volume, primary string, term uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.attached[fmt.Sprintf("%s/%s/%d", volume, primary, term)]
}

func (s *memStore) ApplyOp(context.Context, string, Op) error { return nil }

// CloneCopy makes op.Name like CreateCopy: a volume of its own, a clone of
// volume.
func (s *memStore) CloneCopy(ctx context.Context, volume string, op Op) (string, error) {
	uid, err := s.CreateCopy(ctx, api.VolumeSpec{Name: op.Name})
	if err == nil {
		s.mu.Lock()
		if s.clones == nil {
			s.clones = map[string]string{}
		}
		s.clones[op.Name] = volume
		s.mu.Unlock()
	}
	return uid, err
}

func (s *memStore) DeleteUnplacedClone(_ context.Context, volume, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.clones[name] == volume && volume != "" {
		delete(s.vols, name)
		delete(s.clones, name)
	}
	return nil
}
func (s *memStore) AdoptAttachments(_ context.Context, volume string, state []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.adopted == nil {
		s.adopted = map[string]string{}
	}
	s.adopted[volume] = string(state)
	return nil
}
