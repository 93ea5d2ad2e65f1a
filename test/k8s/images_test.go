package k8stest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The images the cluster runs, every one built here: there is no registry.
// The CSI sidecars and the snapshot controller carry their upstream names
// and versions (build/sidecars pins the same), so upstream manifests and the
// chart's defaults name them unchanged.
const (
	pauseImage              = "registry.k8s.io/pause:3.10"
	corednsImage            = "registry.k8s.io/coredns/coredns:v1.12.4"
	provisionerImage        = "registry.k8s.io/sig-storage/csi-provisioner:v5.3.0"
	attacherImage           = "registry.k8s.io/sig-storage/csi-attacher:v4.13.0"
	resizerImage            = "registry.k8s.io/sig-storage/csi-resizer:v1.14.0"
	snapshotterImage        = "registry.k8s.io/sig-storage/csi-snapshotter:v8.7.0"
	snapshotControllerImage = "registry.k8s.io/sig-storage/snapshot-controller:v8.7.0"
	// quiverVersion is the tag of the quiver image the test builds.
	quiverVersion = "e2e"
	quiverImage   = "quiver:" + quiverVersion
)

// buildImages writes every image as a docker-archive into dir and returns
// their paths: the quiver image by `make image`, the others one static
// binary each by build/image's assembler.
func buildImages(t *testing.T, bins map[string]string, dir string) []string {
	t.Helper()
	root := repoRoot(t)
	start := time.Now()
	assemble := filepath.Join(dir, "assemble")
	if out, err := exec.Command("go", "build", "-C", filepath.Join(root, "build", "image"), "-o", assemble, ".").CombinedOutput(); err != nil {
		t.Fatalf("build the assembler: %v\n%s", err, out)
	}
	pause := filepath.Join(dir, "pause")
	cmd := exec.Command("go", "build", "-trimpath", "-o", pause, "./build/pause")
	cmd.Dir, cmd.Env = root, append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build pause: %v\n%s", err, out)
	}
	single := []struct{ image, bin string }{
		{pauseImage, pause},
		{corednsImage, bins["coredns"]},
		{provisionerImage, bins["csi-provisioner"]},
		{attacherImage, bins["csi-attacher"]},
		{resizerImage, bins["csi-resizer"]},
		{snapshotterImage, bins["csi-snapshotter"]},
		{snapshotControllerImage, bins["snapshot-controller"]},
	}
	var tars []string
	for _, s := range single {
		name := filepath.Base(s.bin)
		out := filepath.Join(dir, name+".tar")
		args := []string{"-add", s.bin + ":/" + name, "-entrypoint", "/" + name, "-tag", s.image, "-o", out}
		if b, err := exec.Command(assemble, args...).CombinedOutput(); err != nil {
			t.Fatalf("image %s: %v\n%s", s.image, err, b)
		}
		tars = append(tars, out)
	}
	quiverTar := filepath.Join(dir, "quiver.tar")
	make := exec.Command("make", "image", "VERSION="+quiverVersion, "IMAGE_TAR="+quiverTar, "IMAGE_WORK="+filepath.Join(dir, "quiver"))
	make.Dir = root
	if out, err := make.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	t.Logf("images built in %v", time.Since(start).Round(time.Second))
	return append(tars, quiverTar)
}

// importImages loads the archives into containerd's Kubernetes namespace.
func (k *kube) importImages(tars []string) {
	k.t.Helper()
	for _, tar := range tars {
		if _, err := k.ctr("images", "import", tar); err != nil {
			k.t.Fatal(err)
		}
	}
	out, err := k.ctr("images", "ls", "-q")
	if err != nil {
		k.t.Fatal(err)
	}
	for _, want := range []string{pauseImage, corednsImage, provisionerImage, quiverImage} {
		if !strings.Contains(string(out), want) {
			k.t.Fatalf("image %s not in containerd after import:\n%s", want, out)
		}
	}
}

// must fails the test on err.
func must(t *testing.T, err error, what string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(what, args...), err)
	}
}
