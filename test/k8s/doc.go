// Package k8stest is quiver's end-to-end test on a real Kubernetes built on
// this machine (issue 31): kube-apiserver, kube-controller-manager,
// kube-scheduler, kubelet and kube-proxy from k8s.io/kubernetes at a pinned
// version, etcd, CoreDNS, containerd and runc from Debian, the CSI sidecars
// from their modules, every image built locally (there is no registry) and
// quiver installed with its Helm chart. See docs/k8s-e2e.md.
//
// The binaries take tens of minutes to build cold on 2 cores, so the test
// runs when they are in the cache (scripts/e2e-bins --cached) or when
// QUIVER_E2E_K8S=1 asks it to build them (`make e2e-k8s`), and skips
// otherwise, saying so, even in CI: CI's time limit does not hold a cold
// build.
package k8stest
