package k8stest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// release is the chart's release in the test: its objects are named quiver-*.
const (
	release   = "quiver"
	namespace = "quiver"
)

// helm runs the Helm CLI that scripts/helm builds, as the cluster's admin.
func (k *kube) helm(args ...string) ([]byte, error) {
	if k.helmBin == "" {
		out, err := exec.Command(filepath.Join(repoRoot(k.t), "scripts", "helm")).Output()
		if err != nil {
			return nil, fmt.Errorf("scripts/helm: %v", err)
		}
		k.helmBin = strings.TrimSpace(string(out))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=/run/netns/" + k.ns, "--", k.helmBin,
		"--kubeconfig", k.admin}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("helm %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// chartValues are the --set values of the test's install: the images built
// here, the kubelet's and the pool's directories of this run, no liveness
// probe sidecar (its module is not fetchable here).
func (k *kube) chartValues() []string {
	pool := filepath.Join(k.work, "pool")
	return []string{
		"image.tag=" + quiverVersion,
		"storage.node.hostPath=" + pool,
		"csi.node.poolDir=" + pool,
		"csi.node.kubeletDir=" + k.KubeletDir,
		"csi.node.stateDir=" + filepath.Join(k.work, "csi-state"),
		"csi.node.livenessProbe=false",
		"endpoint.root=" + filepath.Join(k.work, "endpoint"),
		"endpoint.runDir=" + filepath.Join(k.run, "quiver"),
	}
}

// extraValues are more --set values from QUIVER_E2E_SET (comma-separated
// key=value, as helm's --set takes them): how a check is seen to fail, by
// installing a broken chart (docs/k8s-e2e.md).
func extraValues() []string {
	if v := os.Getenv("QUIVER_E2E_SET"); v != "" {
		return []string{v}
	}
	return nil
}

// install labels the node for the storage node and installs the chart,
// waiting for every workload to be ready.
func (k *kube) install() {
	k.t.Helper()
	if _, err := k.kubectl("label", "node", nodeName, "quiver.io/storage=true", "--overwrite"); err != nil {
		k.t.Fatal(err)
	}
	args := []string{"install", release, filepath.Join(repoRoot(k.t), "deploy", "helm", "quiver"),
		"-n", namespace, "--create-namespace", "--wait", "--timeout", "5m"}
	for _, v := range append(k.chartValues(), extraValues()...) {
		args = append(args, "--set", v)
	}
	start := time.Now()
	if out, err := k.helm(args...); err != nil {
		k.describe(namespace)
		k.t.Fatalf("%v\n%s", err, out)
	}
	k.t.Logf("helm install: ready in %v", time.Since(start).Round(time.Second))
}

// describe logs the state of a namespace's pods, for a failure's report.
func (k *kube) describe(ns string) {
	out, _ := k.kubectl("-n", ns, "get", "pods,pvc,volumesnapshots", "-o", "wide")
	k.t.Logf("%s:\n%s", ns, out)
	out, _ = k.kubectl("-n", ns, "get", "events", "--sort-by=.lastTimestamp")
	k.t.Logf("events in %s:\n%s", ns, tailLines(string(out), 40))
	pods, _ := k.kubectl("-n", ns, "get", "pods", "-o", "name")
	for _, p := range strings.Fields(string(pods)) {
		logs, err := k.kubectl("-n", ns, "logs", p, "--all-containers", "--tail=30")
		k.t.Logf("--- logs of %s (%v):\n%s", p, err, logs)
	}
}

func tailLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
