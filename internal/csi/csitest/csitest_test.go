package csitest

import (
	"os"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/quiverstorage/quiver/internal/csi"
)

// TestStart: the plugin answers over its socket (its identity, and a
// controller call that reaches the quiver server: none listens, so it
// fails as Unavailable rather than as an unknown service), and Stop, called
// twice, ends it and removes its directory.
func TestStart(t *testing.T) {
	p := Start(t, csi.Config{Mode: csi.ModeController, Server: "http://127.0.0.1:1"})
	info, err := csipb.NewIdentityClient(p.Conn).GetPluginInfo(t.Context(), &csipb.GetPluginInfoRequest{})
	if err != nil || info.GetName() != csi.DefaultDriverName {
		t.Fatalf("GetPluginInfo: %v, %v", info, err)
	}
	_, err = p.Controller().DeleteVolume(t.Context(), &csipb.DeleteVolumeRequest{VolumeId: "vm"})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("DeleteVolume without a quiver server: %v, want Unavailable", err)
	}
	sock := strings.TrimPrefix(p.Endpoint, "unix://")
	if _, err := os.Stat(sock); err != nil {
		t.Fatal(err)
	}
	p.Stop()
	p.Stop()
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatalf("the socket after Stop: %v", err)
	}
}
