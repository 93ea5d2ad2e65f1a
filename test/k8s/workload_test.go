package k8stest

import (
	"fmt"
	"strings"
	"time"
)

// The workloads: pods of the quiver image (it has a shell and coreutils)
// that write a disk of their PVC and say what they wrote in their log.
const (
	appNS       = "e2e"
	fsClass     = "quiver-vm-migratable"
	snapClass   = "quiver-snapshots"
	writeMiB    = 8
	fsDiskPath  = "/data/disk.img"
	blockDevice = "/dev/xvda"
)

// pvc is a claim of class, mode (Filesystem or Block) and size, made from
// source ("" or "VolumeSnapshot/<name>" or "PersistentVolumeClaim/<name>").
func pvc(name, mode, size, source string) string {
	ds := ""
	if source != "" {
		kind, src, _ := strings.Cut(source, "/")
		group := ""
		if kind == "VolumeSnapshot" {
			group = "\n    apiGroup: snapshot.storage.k8s.io"
		}
		ds = fmt.Sprintf("\n  dataSource:\n    kind: %s\n    name: %s%s", kind, src, group)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: %s, namespace: %s}
spec:
  storageClassName: %s
  volumeMode: %s
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: %s}}%s
`, name, appNS, fsClass, mode, size, ds)
}

// writerPod writes writeMiB MiB of random bytes at the start of the PVC's
// disk (the file in Filesystem mode, the device in Block mode), reads them
// back, and logs "WROTE <sha256>"; with verify it only reads and logs
// "READ <sha256>". Then it sleeps, holding the volume.
func writerPod(name, claim, mode string, verify bool) string {
	target := fsDiskPath
	mount := fmt.Sprintf("volumeMounts: [{name: v, mountPath: /data}]")
	if mode == "Block" {
		target = blockDevice
		mount = fmt.Sprintf("volumeDevices: [{name: v, devicePath: %s}]", blockDevice)
	}
	script := fmt.Sprintf(`set -e
dd if=/dev/urandom of=/tmp/w bs=1M count=%[1]d status=none
dd if=/tmp/w of=%[2]s bs=1M conv=notrunc,fsync status=none
want=$(sha256sum </tmp/w | cut -d' ' -f1)
got=$(head -c %[3]d %[2]s | sha256sum | cut -d' ' -f1)
[ "$want" = "$got" ] || { echo "MISMATCH $want $got"; exit 1; }
echo "WROTE $got"
exec sleep 100000`, writeMiB, target, writeMiB<<20)
	if verify {
		script = fmt.Sprintf(`set -e
echo "READ $(head -c %[1]d %[2]s | sha256sum | cut -d' ' -f1) SIZE $(blockdev --getsize64 %[2]s 2>/dev/null || stat -c %%s %[2]s)"
exec sleep 100000`, writeMiB<<20, target)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: %s}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: w
    image: %s
    imagePullPolicy: Never
    command: ["sh", "-c", %q]
    %s
  volumes:
  - name: v
    persistentVolumeClaim: {claimName: %s}
`, name, appNS, quiverImage, script, mount, claim)
}

// logLine waits for the pod's log to hold a line starting with prefix and
// returns its words after prefix.
func (k *kube) logLine(pod, prefix string, timeout time.Duration) []string {
	k.t.Helper()
	var words []string
	k.waitFor("pod "+pod+" to log "+prefix, timeout, func() error {
		out, err := k.kubectl("-n", appNS, "logs", pod)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "MISMATCH") {
				k.describe(appNS)
				k.t.Fatalf("pod %s: %s", pod, line)
			}
			if rest, ok := strings.CutPrefix(line, prefix+" "); ok {
				words = strings.Fields(rest)
				return nil
			}
		}
		return fmt.Errorf("not yet: %q", tailLines(string(out), 3))
	})
	return words
}

// jsonpath reads one field of an object.
func (k *kube) jsonpath(ns, obj, path string) string {
	out, err := k.kubectl("-n", ns, "get", obj, "-o", "jsonpath="+path)
	if err != nil {
		return ""
	}
	return string(out)
}
