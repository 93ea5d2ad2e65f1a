package csi

import (
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"

	"github.com/quiverstorage/quiver/internal/testfs"
)

// allowedSkips are the skip messages csi-sanity may give: each is a
// capability quiver does not advertise (docs/csi.md says why). Any other
// skip fails TestSanity, so a capability cannot stop being tested silently.
var allowedSkips = []string{
	"ControllerModifyVolume not supported",
	"Modify volume not supported",
	"Modify Volume not supported",
	"ControllerGetVolumeHealth not supported",
	"ControllerListVolumeHealth not supported",
	"SNAPSHOT_ACCESSIBILITY_CONSTRAINTS not supported",
	"No MaxVolumesPerNode",
	"NodeExpandVolume not supported",
	"NodeGetVolumeHealth not supported",
	"NodeGetStorageHealth not supported",
	"GroupControllerService not supported",
}

// TestSanity runs every csi-sanity spec against the plugin (all mode, in
// process) backed by a real `quiver server` with a bearer token: once with
// Filesystem-mode volumes and once with Block-mode volumes (nbdfuse and a
// loop device, which need root).
func TestSanity(t *testing.T) {
	if testing.Short() {
		t.Skip("csi-sanity starts a server and runs hundreds of specs")
	}
	testfs.RequireRoot(t)
	for _, tool := range []string{"nbdfuse", "losetup", "mount", "umount"} {
		testfs.RequireTool(t, tool)
	}
	s := startServer(t)
	p := startPlugin(t, s, "sanity-node", true)

	base := t.TempDir()
	configs := map[string]*sanity.TestConfig{}
	for _, accessType := range []string{"mount", "block"} {
		cfg := sanity.NewTestConfig()
		cfg.Address = p.endpoint
		cfg.TargetPath = filepath.Join(base, accessType+"-target")
		cfg.StagingPath = filepath.Join(base, accessType+"-staging")
		cfg.TestVolumeAccessType = accessType
		cfg.TestVolumeSize = 64 << 20
		cfg.TestNodeVolumeAttachLimit = true
		cfg.IdempotentCount = 3
		configs[accessType] = &cfg
	}
	var contexts []*sanity.TestContext
	for _, accessType := range []string{"mount", "block"} {
		ginkgo.Describe("access type "+accessType, func() {
			contexts = append(contexts, sanity.GinkgoTest(configs[accessType]))
		})
	}
	var skipped, passed, failed []string
	ginkgo.ReportAfterSuite("quiver sanity summary", func(r ginkgo.Report) {
		for _, spec := range r.SpecReports {
			if spec.LeafNodeType != types.NodeTypeIt {
				continue
			}
			name := spec.FullText()
			switch spec.State {
			case types.SpecStateSkipped:
				skipped = append(skipped, name+" -- "+spec.Failure.Message)
			case types.SpecStatePassed:
				passed = append(passed, name)
			case types.SpecStatePending:
			default:
				failed = append(failed, name)
			}
		}
	})
	gomega.RegisterFailHandler(ginkgo.Fail)
	suiteCfg, reporterCfg := ginkgo.GinkgoConfiguration()
	reporterCfg.Succinct = !testing.Verbose()
	ginkgo.RunSpecs(t, "quiver CSI sanity", suiteCfg, reporterCfg)
	for _, sc := range contexts {
		sc.Finalize()
	}
	sort.Strings(skipped)
	t.Logf("csi-sanity: %d passed, %d failed, %d skipped", len(passed), len(failed), len(skipped))
	for _, s := range skipped {
		t.Logf("skipped: %s", s)
		_, reason, _ := strings.Cut(s, " -- ")
		if !slices.Contains(allowedSkips, reason) {
			t.Errorf("unexpected skip (only capabilities quiver does not advertise may skip): %s", s)
		}
	}
}
