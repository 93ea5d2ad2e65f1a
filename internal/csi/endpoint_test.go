package csi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/endpoint"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// clusterVolumeAPI answers GET /v1/volumes/vm with a volume kept by a
// cluster (two copies, a primary) whose reported path is copyDir: the files
// of this node's copy, which Filesystem staging must never bind.
func clusterVolumeAPI(t *testing.T, copyDir string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method != http.MethodGet || r.URL.Path != "/v1/volumes/vm" {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(api.ErrorBody{Error: api.Error{Code: api.CodeNotFound, Message: "not found: " + r.URL.Path}})
			return
		}
		_ = json.NewEncoder(w).Encode(api.Volume{Name: "vm", Path: copyDir, Capacity: 4 << 20, Replicas: 2,
			Disks:   []api.Disk{{Name: "disk", Size: 1 << 20}, {Name: "data", Size: 2 << 20}},
			Copies:  []api.Copy{{Node: "n1", State: api.CopyInSync}, {Node: "n2", State: api.CopyInSync}},
			Primary: "n1", Term: 3})
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestFilesystemStagingOfReplicatedVolume (issue 30, acceptance 5): a
// Filesystem-mode staging of a volume kept by a cluster never binds a
// copy's directory. Without the node's endpoint the plugin refuses with
// FailedPrecondition, naming the remedy, and mounts nothing; with it, the
// staging path is the endpoint's socket directory for that volume (socket,
// manifest, empty placeholder), and unstaging unpublishes it there.
func TestFilesystemStagingOfReplicatedVolume(t *testing.T) {
	testfs.RequireRoot(t)
	copyDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(copyDir, "disk.img"), []byte("a copy's own file"), 0o644); err != nil {
		t.Fatal(err)
	}
	apiURL := clusterVolumeAPI(t, copyDir)
	vc := mountCap(csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)
	pubCtx := map[string]string{PublishToken: "tok123", PublishAttachment: "att-1", PublishExportVolume: "vm"}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	stage := func(cfg Config, staging string) error {
		p := servePlugin(t, cfg)
		_, err := p.node.NodeStageVolume(context.Background(), &csipb.NodeStageVolumeRequest{
			VolumeId: "vm", StagingTargetPath: staging, VolumeCapability: vc, PublishContext: pubCtx})
		return err
	}
	dir := shortTempDir(t)
	staging := filepath.Join(dir, "staging")
	err := stage(Config{Mode: ModeNode, Server: apiURL, NodeID: "c1", StateDir: filepath.Join(dir, "state1"), Logger: quiet,
		Endpoint: "unix://" + filepath.Join(dir, "csi1.sock")}, staging)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "quiver endpoint") {
		t.Fatalf("staging without the endpoint: %v, want FailedPrecondition naming `quiver endpoint`", err)
	}
	if isMount(t, staging) {
		t.Fatal("the refused staging left a mount")
	}

	// The node's endpoint, in this process, on its control socket.
	c, err := client.New(apiURL)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := endpoint.Open(endpoint.Config{Root: filepath.Join(dir, "ep"), Locator: endpoint.NewLocator(c), Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	ctl := filepath.Join(dir, "ep.sock")
	ln, err := net.Listen("unix", ctl)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: ep.Handler(nil)}
	go hs.Serve(ln)
	defer hs.Close()

	cfg := Config{Mode: ModeNode, Server: apiURL, NodeID: "c1", StateDir: filepath.Join(dir, "state2"), Logger: quiet, QuiverEndpoint: ctl,
		Endpoint: "unix://" + filepath.Join(dir, "csi2.sock")}
	node := servePlugin(t, cfg).node
	if _, err := node.NodeStageVolume(context.Background(), &csipb.NodeStageVolumeRequest{
		VolumeId: "vm", StagingTargetPath: staging, VolumeCapability: vc, PublishContext: pubCtx}); err != nil {
		t.Fatalf("staging through the endpoint: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(staging, syscall.MNT_DETACH) })
	if !isMount(t, staging) {
		t.Fatal("the staging path is not a mount")
	}
	b, err := os.ReadFile(filepath.Join(staging, "disk.img"))
	if err != nil || len(b) != 0 {
		t.Fatalf("disk.img at the staging path: %q %v, want the endpoint's empty placeholder, never the copy's file", b, err)
	}
	for _, f := range []string{endpoint.SocketName, endpoint.ManifestName} {
		if _, err := os.Stat(filepath.Join(staging, f)); err != nil {
			t.Errorf("the staging path has no %s: %v", f, err)
		}
	}
	if list := ep.List(); len(list) != 1 || list[0].Name != "vm" || list[0].Export != "vm" || len(list[0].Disks) != 2 {
		t.Fatalf("the endpoint serves %+v", list)
	}
	if _, err := node.NodeUnstageVolume(context.Background(), &csipb.NodeUnstageVolumeRequest{VolumeId: "vm", StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if isMount(t, staging) {
		t.Fatal("still mounted after unstage")
	}
	if n := len(ep.List()); n != 0 {
		t.Fatalf("the endpoint still serves %d volumes after unstage", n)
	}
	if _, err := os.Stat(ep.Dir("vm")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the endpoint's directory after unstage: %v", err)
	}
}

func isMount(t *testing.T, path string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}
