package sanitytest

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
	"github.com/onsi/gomega"
)

// AllowedSkips are the skip messages csi-sanity may give: each is a
// capability quiver does not advertise (docs/csi.md says why).
var AllowedSkips = []string{
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

// Config is one run.
type Config struct {
	Endpoint string // the plugin's CSI socket, unix:///path
	// Dir holds the target and staging paths (a test's temp dir).
	Dir string
	// AccessTypes are csi-sanity's volume access types to run every spec
	// with: "mount" (Filesystem), "block".
	AccessTypes []string
	VolumeSize  int64
	// AfterEach, if set, runs after every spec, before csi-sanity cleans
	// up what the spec made.
	AfterEach func()
	// NotBuilt maps a part of the text of the specs not run (ginkgo's
	// --skip) to why: what the setup under test does not do yet. Each is
	// logged with its reason; every other skip still fails t.
	NotBuilt map[string]string
}

// Result counts the specs.
type Result struct {
	Passed, Failed, Skipped []string // full spec texts; a skip's with " -- " and its message
}

// Run runs every csi-sanity spec once per access type, logs the summary,
// and fails t on a failed spec (ginkgo's fail handler) and on a skip not in
// AllowedSkips.
func Run(t *testing.T, cfg Config) Result {
	t.Helper()
	var contexts []*sanity.TestContext
	for _, accessType := range cfg.AccessTypes {
		sc := sanity.NewTestConfig()
		sc.Address = cfg.Endpoint
		sc.TargetPath = filepath.Join(cfg.Dir, accessType+"-target")
		sc.StagingPath = filepath.Join(cfg.Dir, accessType+"-staging")
		sc.TestVolumeAccessType = accessType
		sc.TestVolumeSize = cfg.VolumeSize
		sc.TestNodeVolumeAttachLimit = true
		sc.IdempotentCount = 3
		ginkgo.Describe("access type "+accessType, func() {
			contexts = append(contexts, sanity.GinkgoTest(&sc))
			if cfg.AfterEach != nil {
				ginkgo.JustAfterEach(cfg.AfterEach)
			}
		})
	}
	var res Result
	var failures []string
	ginkgo.ReportAfterSuite("quiver sanity summary", func(r ginkgo.Report) {
		for _, spec := range r.SpecReports {
			if spec.LeafNodeType != types.NodeTypeIt {
				continue
			}
			name := spec.FullText()
			switch spec.State {
			case types.SpecStateSkipped:
				res.Skipped = append(res.Skipped, name+" -- "+spec.Failure.Message)
			case types.SpecStatePassed:
				res.Passed = append(res.Passed, name)
			case types.SpecStatePending:
			default:
				res.Failed = append(res.Failed, name)
				failures = append(failures, fmt.Sprintf("%s: %s (%s)", name, spec.Failure.Message, spec.Failure.Location))
			}
		}
	})
	gomega.RegisterFailHandler(ginkgo.Fail)
	suiteCfg, reporterCfg := ginkgo.GinkgoConfiguration()
	for text := range cfg.NotBuilt {
		suiteCfg.SkipStrings = append(suiteCfg.SkipStrings, regexp.QuoteMeta(text))
	}
	reporterCfg.Succinct = !testing.Verbose()
	ginkgo.RunSpecs(t, "quiver CSI sanity", suiteCfg, reporterCfg)
	for _, sc := range contexts {
		sc.Finalize()
	}
	sort.Strings(res.Skipped)
	t.Logf("csi-sanity: %d passed, %d failed, %d skipped", len(res.Passed), len(res.Failed), len(res.Skipped))
	// Ginkgo has failed t already; named here too, so a log cut to its end
	// (scripts/gotest's summary) says which spec failed and why.
	for _, f := range failures {
		t.Errorf("spec failed: %s", f)
	}
	for _, s := range res.Skipped {
		name, reason, _ := strings.Cut(s, " -- ")
		if why, ok := notBuilt(cfg.NotBuilt, name); ok {
			t.Logf("not run: %s -- not built: %s", name, why)
			continue
		}
		t.Logf("skipped: %s", s)
		if !slices.Contains(AllowedSkips, reason) {
			t.Errorf("unexpected skip (only capabilities quiver does not advertise may skip): %s", s)
		}
	}
	return res
}

// notBuilt returns the reason of the NotBuilt entry that spec's text
// contains.
func notBuilt(nb map[string]string, spec string) (string, bool) {
	for text, why := range nb {
		if strings.Contains(spec, text) {
			return why, true
		}
	}
	return "", false
}
