package k8stest

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/testfs"
)

// repoRoot is the repository's top directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// e2eBins returns every binary of the cluster by name, built by
// scripts/e2e-bins (or found in its cache), and skips the test when they are
// not cached and QUIVER_E2E_K8S is not set.
func e2eBins(t *testing.T) map[string]string {
	t.Helper()
	args := []string{"--cached"}
	if os.Getenv("QUIVER_E2E_K8S") != "" {
		args = nil
	}
	cmd := exec.Command(filepath.Join(repoRoot(t), "scripts", "e2e-bins"), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 3 {
			t.Skipf("the Kubernetes binaries are not built (%s); `make e2e-k8s` builds them (tens of minutes cold, so CI does not)",
				strings.TrimSpace(stderr.String()))
		}
		t.Fatalf("scripts/e2e-bins: %v\n%s", err, stderr.String())
	}
	bins := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		_, dir, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			continue
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if !e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
				bins[e.Name()] = filepath.Join(dir, e.Name())
			}
		}
	}
	for _, name := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet",
		"kube-proxy", "kubectl", "coredns", "csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter",
		"snapshot-controller"} {
		if bins[name] == "" {
			t.Fatalf("scripts/e2e-bins built no %s", name)
		}
	}
	for _, tool := range []string{"nsenter", "ip", "containerd", "ctr", "runc", "iptables", "mount"} {
		testfs.RequireTool(t, tool)
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		testfs.SkipOrFail(t, "the CNI plugins are missing (Debian's containernetworking-plugins): %v", err)
	}
	return bins
}
