package k8stest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testfs"
)

// TestKubernetes installs quiver with its Helm chart on a one-node
// Kubernetes built here and takes it through what a user does: see doc.go
// and docs/k8s-e2e.md.
func TestKubernetes(t *testing.T) {
	testfs.RequireRoot(t)
	bins := e2eBins(t)
	for _, tool := range []string{"mmdebstrap", "make"} {
		testfs.RequireTool(t, tool)
	}
	images := buildImages(t, bins, t.TempDir())

	start := time.Now()
	k := startKube(t, bins)
	t.Logf("Kubernetes up in %v", time.Since(start).Round(time.Second))
	k.importImages(images)
	k.addons()
}

// addons installs the cluster's DNS and the CSI snapshot CRDs and
// controller, from their upstream manifests in the module cache.
func (k *kube) addons() {
	k.t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(k.t), "test", "k8s", "testdata", "coredns.yaml"))
	must(k.t, err, "coredns manifest")
	k.apply(strings.ReplaceAll(string(b), "IMAGE", corednsImage))

	dir := moduleDir(k.t, filepath.Join(repoRoot(k.t), "build", "sidecars", "csi-snapshotter"),
		"github.com/kubernetes-csi/external-snapshotter/client/v8")
	for _, crd := range []string{"volumesnapshotclasses", "volumesnapshotcontents", "volumesnapshots"} {
		b, err := os.ReadFile(filepath.Join(dir, "config", "crd", "snapshot.storage.k8s.io_"+crd+".yaml"))
		must(k.t, err, "snapshot CRD")
		k.apply(string(b))
	}
	ctl := moduleDir(k.t, filepath.Join(repoRoot(k.t), "build", "sidecars", "csi-snapshotter"),
		"github.com/kubernetes-csi/external-snapshotter/v8")
	for _, f := range []string{"rbac-snapshot-controller.yaml", "setup-snapshot-controller.yaml"} {
		b, err := os.ReadFile(filepath.Join(ctl, "deploy", "kubernetes", "snapshot-controller", f))
		must(k.t, err, "snapshot controller manifest")
		text := string(b)
		// The upstream manifest names an image by its own release; the test
		// built the pinned one under its upstream name.
		text = replaceImage(text, "registry.k8s.io/sig-storage/snapshot-controller:", snapshotControllerImage)
		k.apply(text)
	}
	k.waitFor("CoreDNS and the snapshot controller", 3*time.Minute, func() error {
		for _, d := range []string{"kube-system/coredns", "kube-system/snapshot-controller"} {
			ns, name, _ := strings.Cut(d, "/")
			if _, err := k.kubectl("-n", ns, "rollout", "status", "deployment/"+name, "--timeout=1s"); err != nil {
				return err
			}
		}
		return nil
	})
}

// replaceImage sets every image line that starts with prefix to image.
func replaceImage(text, prefix, image string) string {
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		if j := strings.Index(l, prefix); j >= 0 && strings.Contains(l[:j], "image:") {
			lines[i] = l[:j] + image
		}
	}
	return strings.Join(lines, "\n")
}

// moduleDir is where the module cache holds module, as the wrapper module
// in dir requires it.
func moduleDir(t *testing.T, dir, module string) string {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", module)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		// go list -m needs the module downloaded.
		dl := exec.Command("go", "mod", "download", module)
		dl.Dir = dir
		if b, err := dl.CombinedOutput(); err != nil {
			t.Fatalf("go mod download %s: %v\n%s", module, err, b)
		}
		if out, err = cmd.Output(); err != nil {
			t.Fatalf("go list -m %s: %v", module, err)
		}
	}
	return strings.TrimSpace(string(out))
}
