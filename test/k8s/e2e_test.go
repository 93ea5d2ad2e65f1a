package k8stest

import (
	"encoding/json"
	"fmt"
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
	k.install()
	if _, err := k.kubectl("create", "namespace", appNS); err != nil {
		t.Fatal(err)
	}

	// A Filesystem PVC and a Block PVC, bound and written by pods.
	k.apply(pvc("fs", "Filesystem", "1Gi", "") + "---\n" + pvc("blk", "Block", "1Gi", ""))
	k.apply(writerPod("fs-writer", "fs", "Filesystem", false) + "---\n" + writerPod("blk-writer", "blk", "Block", false))
	fsSum := k.logLine("fs-writer", "WROTE", 3*time.Minute)[0]
	blkSum := k.logLine("blk-writer", "WROTE", 3*time.Minute)[0]
	t.Logf("written: Filesystem PVC %s, Block PVC %s", fsSum[:12], blkSum[:12])

	// A VolumeSnapshot of the Filesystem PVC, then a PVC from it and a
	// clone of the PVC itself: both hold what the pod wrote.
	k.apply(fmt.Sprintf(`apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata: {name: fs-snap, namespace: %s}
spec:
  volumeSnapshotClassName: %s
  source: {persistentVolumeClaimName: fs}
`, appNS, snapClass))
	k.waitFor("the VolumeSnapshot ready", 2*time.Minute, func() error {
		if got := k.jsonpath(appNS, "volumesnapshot/fs-snap", "{.status.readyToUse}"); got != "true" {
			return fmt.Errorf("readyToUse=%q", got)
		}
		return nil
	})
	k.apply(pvc("fs-restore", "Filesystem", "1Gi", "VolumeSnapshot/fs-snap") + "---\n" + pvc("fs-clone", "Filesystem", "1Gi", "PersistentVolumeClaim/fs"))
	k.apply(writerPod("restore-reader", "fs-restore", "Filesystem", true) + "---\n" + writerPod("clone-reader", "fs-clone", "Filesystem", true))
	for _, pod := range []string{"restore-reader", "clone-reader"} {
		if got := k.logLine(pod, "READ", 3*time.Minute); got[0] != fsSum {
			t.Errorf("%s read %s, want what fs-writer wrote, %s", pod, got[0], fsSum)
		}
	}

	// Expansion: the Filesystem PVC grows to 2Gi; its disk with it.
	if _, err := k.kubectl("-n", appNS, "patch", "pvc", "fs", "--type=merge", "-p", `{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}`); err != nil {
		t.Fatal(err)
	}
	k.waitFor("the PVC expanded", 2*time.Minute, func() error {
		if got := k.jsonpath(appNS, "pvc/fs", "{.status.capacity.storage}"); got != "2Gi" {
			return fmt.Errorf("capacity %q", got)
		}
		return nil
	})
	out, err := k.kubectl("-n", appNS, "exec", "fs-writer", "--", "stat", "-c", "%s", fsDiskPath)
	if err != nil || strings.TrimSpace(string(out)) != "2147483648" {
		t.Errorf("after expansion the disk is %q bytes (%v), want 2147483648", out, err)
	}

	k.webhook()
	k.rollNodePlugin()
	k.deleteAll()
}

// webhook: with KubeVirt's kinds known to the API server, a
// VirtualMachineInstance naming a quiver PVC is admitted with quiver's hook
// sidecar added, and one the webhook must refuse is refused with its reason.
func (k *kube) webhook() {
	k.t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(k.t), "test", "k8s", "testdata", "kubevirt-crds.yaml"))
	must(k.t, err, "KubeVirt CRDs")
	k.apply(string(b))
	k.waitFor("the KubeVirt CRDs established", time.Minute, func() error {
		_, err := k.kubectl("wait", "--for=condition=Established", "--timeout=1s",
			"crd/virtualmachineinstances.kubevirt.io", "crd/virtualmachines.kubevirt.io")
		return err
	})
	// A volume of three disks: the webhook names the two beside disk.img
	// and adds its hook sidecar (a one-disk volume on a single node
	// needs neither: KubeVirt boots its disk.img).
	k.apply(fmt.Sprintf(`apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: %[2]s}
provisioner: csi.quiver.io
parameters: {disks: "disk=64Mi,data=16Mi,logs=16Mi"}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: vmdisks, namespace: %[1]s}
spec:
  storageClassName: %[2]s
  volumeMode: Filesystem
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 96Mi}}
`, appNS, vmClass))
	vmi := func(name, annotations string) string {
		return fmt.Sprintf(`apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: %s
  namespace: %s
  annotations: {%s}
spec:
  domain:
    devices:
      disks: [{name: root, disk: {bus: virtio}}]
    resources: {requests: {memory: 128Mi}}
  volumes:
  - name: root
    persistentVolumeClaim: {claimName: vmdisks}
`, name, appNS, annotations)
	}
	k.apply(vmi("vm-good", ""))
	got := k.jsonpath(appNS, "vmi/vm-good", `{.metadata.annotations.hooks\.kubevirt\.io/hookSidecars}`)
	if !strings.Contains(got, "quiver") {
		k.t.Errorf("the admitted VMI has no quiver hook sidecar: hookSidecars = %q", got)
	}
	if got := k.jsonpath(appNS, "vmi/vm-good", `{.metadata.annotations.quiver\.io/extra-disks}`); got != `{"root":["data","logs"]}` {
		k.t.Errorf("the admitted VMI's extra disks: %q, want data and logs of its volume", got)
	}
	out, err := k.kubectlIn([]byte(vmi("vm-bad", `hooks.kubevirt.io/hookSidecars: "not json"`)), "apply", "-f", "-")
	if err == nil || !strings.Contains(err.Error(), "not a JSON list of sidecars") {
		k.t.Errorf("a VMI with a malformed hookSidecars annotation: %v %s, want refused by the webhook with its reason", err, out)
	}
	if _, err := k.kubectl("-n", appNS, "get", "vmi", "vm-bad"); err == nil {
		k.t.Errorf("the refused VMI exists")
	}
	if _, err := k.kubectl("-n", appNS, "delete", "vmi", "vm-good"); err != nil {
		k.t.Error(err)
	}
}

// rollNodePlugin rolls the CSI node plugin's DaemonSet while a pod writes
// its Block PVC with direct I/O: the endpoint holds the device, so the pod
// sees no I/O error and goes on writing after the roll.
func (k *kube) rollNodePlugin() {
	k.t.Helper()
	script := fmt.Sprintf(`i=0
while true; do
  if ! dd if=/dev/urandom of=%s bs=64k count=16 seek=$((i %% 128)) oflag=direct conv=notrunc status=none; then
    echo "IOERROR at $i"
  fi
  i=$((i+1))
  echo "WRITES $i"
  sleep 0.2
done`, blockDevice)
	k.apply(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: blk-roller, namespace: %s}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: w
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", %q]
    volumeDevices: [{name: v, devicePath: %s}]
  volumes:
  - name: v
    persistentVolumeClaim: {claimName: blk}
`, appNS, quiverImage, script, blockDevice))
	// The Block PVC is RWO: the first writer goes first.
	if _, err := k.kubectl("-n", appNS, "delete", "pod", "blk-writer", "--wait=true"); err != nil {
		k.t.Fatal(err)
	}
	writes := func() int {
		out, _ := k.kubectl("-n", appNS, "logs", "blk-roller")
		n := 0
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "IOERROR") {
				k.t.Errorf("blk-roller: %s", line)
			}
			fmt.Sscanf(line, "WRITES %d", &n)
		}
		return n
	}
	k.waitFor("blk-roller writing", 3*time.Minute, func() error {
		if n := writes(); n < 5 {
			return fmt.Errorf("%d writes", n)
		}
		return nil
	})
	before, _ := k.kubectl("-n", namespace, "get", "pods", "-l", "app.kubernetes.io/component=csi-node", "-o", "name")
	if _, err := k.kubectl("-n", namespace, "rollout", "restart", "daemonset/"+release+"-csi-node"); err != nil {
		k.t.Fatal(err)
	}
	if _, err := k.kubectl("-n", namespace, "rollout", "status", "daemonset/"+release+"-csi-node", "--timeout=3m"); err != nil {
		k.t.Fatal(err)
	}
	after, _ := k.kubectl("-n", namespace, "get", "pods", "-l", "app.kubernetes.io/component=csi-node", "-o", "name")
	if string(before) == string(after) {
		k.t.Errorf("the node plugin's pod is the same after the roll: %s", after)
	}
	n0 := writes()
	k.waitFor("writes after the roll", time.Minute, func() error {
		if n := writes(); n < n0+10 {
			return fmt.Errorf("%d writes, %d at the roll's end", n, n0)
		}
		return nil
	})
	k.t.Logf("node plugin rolled (%s -> %s) under %d writes of the Block PVC, no I/O error", strings.TrimSpace(string(before)),
		strings.TrimSpace(string(after)), writes())
}

// deleteAll deletes the pods, snapshots and PVCs: quiver then holds no
// volume and the node no mount, device or publication of them.
func (k *kube) deleteAll() {
	k.t.Helper()
	for _, kind := range []string{"pods", "volumesnapshots", "pvc"} {
		if _, err := k.kubectl("-n", appNS, "delete", kind, "--all", "--wait=true", "--timeout=3m"); err != nil {
			k.t.Fatal(err)
		}
	}
	k.waitFor("every PersistentVolume gone", 3*time.Minute, func() error {
		if out, _ := k.kubectl("get", "pv", "-o", "name"); len(out) > 0 {
			return fmt.Errorf("left: %s", out)
		}
		if out, _ := k.kubectl("get", "volumesnapshotcontents", "-o", "name"); len(out) > 0 {
			return fmt.Errorf("left: %s", out)
		}
		return nil
	})
	out, err := k.kubectl("-n", namespace, "exec", "statefulset/"+release+"-storage", "--", "quiver", "--server", "http://127.0.0.1:7480",
		"--token-file", "/etc/quiver/token", "volume", "list", "-o", "json")
	var list struct {
		Items []struct {
			Name string `json:"name"`
		} `json:"items"`
	}
	if err != nil || json.Unmarshal(out, &list) != nil || len(list.Items) != 0 {
		k.t.Errorf("quiver's volumes after every PVC is deleted: %s (%v), want none", out, err)
	}
	// The pool's directory holds no volume either (the server's view
	// above could miss a directory it failed to remove).
	entries, _ := os.ReadDir(filepath.Join(k.work, "pool", "volumes"))
	for _, e := range entries {
		k.t.Errorf("left in the pool: volumes/%s", e.Name())
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(mounts), "\n") {
		if strings.Contains(line, k.KubeletDir+"/") && (strings.Contains(line, "/pvc-") || strings.Contains(line, "fuse")) {
			k.t.Errorf("a mount left on the node: %s", line)
		}
	}
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
