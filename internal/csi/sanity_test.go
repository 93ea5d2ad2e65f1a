package csi

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/csi/sanitytest"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// sanityTenant is the tenant of TestSanity's plugin token.
const sanityTenant = "sanity"

// checkTenant lists every volume as the admin and records any that is not
// the tenant's, or whose pool name does not carry the tenant's prefix.
func checkTenant(admin *server, checked *atomic.Int64, outside *atomic.Value) {
	vols, err := admin.api.ListVolumes(context.Background(), "")
	if err != nil {
		outside.Store(fmt.Sprintf("list as admin: %v", err))
		return
	}
	for _, v := range vols {
		if v.Tenant != sanityTenant || !strings.HasPrefix(v.Name, sanityTenant+"--") {
			outside.Store(fmt.Sprintf("%s (tenant %q)", v.Name, v.Tenant))
			continue
		}
		checked.Add(1)
	}
}

// TestSanity runs every csi-sanity spec against the plugin (all mode, in
// process) backed by a real `quiver server`, the plugin holding a token of
// tenant "sanity" (role tenant), as in a tenant cluster: once with
// Filesystem-mode volumes and once with Block-mode volumes (nbdfuse and a
// loop device, which need root). After every spec, before csi-sanity cleans
// up, the server's admin sees every volume as the tenant's: everything the
// plugin provisions, snapshots, clones and attaches stays in the tenant
// (acceptance 6 of issue 17).
func TestSanity(t *testing.T) {
	if testing.Short() {
		t.Skip("csi-sanity starts a server and runs hundreds of specs")
	}
	testfs.RequireRoot(t)
	for _, tool := range []string{"nbdfuse", "losetup", "mount", "umount"} {
		testfs.RequireTool(t, tool)
	}
	admin := startServer(t)
	tok, err := admin.api.CreateToken(context.Background(), api.TokenSpec{Tenant: sanityTenant, Role: api.RoleTenant})
	if err != nil {
		t.Fatal(err)
	}
	s := *admin
	s.token = tok.Secret
	p := startPlugin(t, &s, "sanity-node", true)
	var checked atomic.Int64 // volumes seen in the tenant
	var outside atomic.Value // a volume seen outside it

	res := sanitytest.Run(t, sanitytest.Config{Endpoint: p.endpoint, Dir: t.TempDir(), AccessTypes: []string{"mount", "block"},
		VolumeSize: 64 << 20, AfterEach: func() { checkTenant(admin, &checked, &outside) }})
	t.Logf("volumes seen after the specs, all of tenant %s: %d", sanityTenant, checked.Load())
	if v := outside.Load(); v != nil {
		t.Errorf("a volume outside tenant %s: %s", sanityTenant, v)
	}
	if checked.Load() == 0 || len(res.Passed) == 0 {
		t.Error("no volume seen after any spec, or no spec passed: the tenant check checked nothing")
	}
}
