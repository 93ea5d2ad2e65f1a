package k8stest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/endpoint"
)

// The node's network: everything runs in a network namespace of the test's
// own, whose one interface (a veth pair, both ends inside) has nodeIP.
const (
	nodeName    = "e2e-node"
	nodeIP      = "10.199.0.1"
	serviceCIDR = "10.96.0.0/16"
	podCIDR     = "10.244.0.0/24"
	dnsIP       = "10.96.0.10"
)

// kube is a one-node Kubernetes cluster: etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, containerd with runc and the CNI
// bridge plugin, kubelet, kube-proxy and CoreDNS, each a process of the
// test's in the network namespace ns (nsenter --net: the mount namespace
// stays the host's, so the kubelet's mounts reach containerd's containers).
type kube struct {
	t          *testing.T
	bins       map[string]string // binary name -> path
	work       string            // files, logs, the kubelet's root
	run        string            // sockets (short paths)
	ns         string
	pki        *pki
	admin      string // the admin's kubeconfig
	ctrSock    string // containerd's socket
	KubeletDir string
	procs      []*proc
	helmBin    string
	shared     []string // the shared bind mounts teardown unmounts
	// netnsBefore: the cni-* namespaces that were there before containerd
	// started (another run's), which teardown leaves alone.
	netnsBefore map[string]bool
}

type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// kubeOptions change the node startKube makes.
type kubeOptions struct {
	// podPIDNamespace runs containerd, its shims and so every pod in a PID
	// namespace of the test's own (with its own /proc), whose PID 1 is
	// containerd: a hostPID pod that enters its node's namespaces through
	// /proc/1/ns (KubeVirt's virt-handler) must be able to open them, and
	// this machine's own PID 1 holds a capability (CAP_SYS_RESOURCE) no
	// process here has, so the kernel lets no one open its namespaces.
	podPIDNamespace bool
	// featureGates go to the API server and the kubelet as
	// --feature-gates, e.g. "PodObservedGenerationTracking=false".
	featureGates string
}

// startKube brings the cluster up and registers its teardown.
func startKube(t *testing.T, bins map[string]string, opts ...kubeOptions) *kube {
	id := fmt.Sprintf("%x", time.Now().UnixNano()&0xffffff)
	k := &kube{t: t, bins: bins, ns: "qe2e-" + id, work: filepath.Join("/var/tmp", "qe2e-"+id), run: "/run/qe2e-" + id}
	for _, d := range []string{k.work, k.run, filepath.Join(k.work, "logs"), filepath.Join(k.work, "pki"), filepath.Join(k.work, "cni")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(k.teardown)
	// The CSI node plugin's mounts reach the kubelet and the pods only
	// through shared mounts (its mountPropagation: Bidirectional of the
	// kubelet's, the state and the endpoint's directories, all under
	// these); / here is private, as it is on a host without systemd.
	for _, dir := range []string{k.work, k.run} {
		for _, args := range [][]string{{"--bind", dir, dir}, {"--make-rshared", dir}} {
			if out, err := exec.Command("mount", args...).CombinedOutput(); err != nil {
				t.Fatalf("mount %v: %v: %s", args, err, out)
			}
		}
		k.shared = append(k.shared, dir)
	}
	k.network()

	var err error
	if k.pki, err = newPKI(filepath.Join(k.work, "pki")); err != nil {
		t.Fatal(err)
	}
	server := "https://" + nodeIP + ":6443"
	apiCert, apiKey, err := k.pki.issue("apiserver", "kube-apiserver", nil,
		[]string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "localhost"},
		[]net.IP{net.ParseIP(nodeIP), net.ParseIP("10.96.0.1"), net.ParseIP("127.0.0.1")})
	if err != nil {
		t.Fatal(err)
	}
	kubeletClientCert, kubeletClientKey, err := k.pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The aggregation layer's proxy client: extension API servers
	// (KubeVirt's virt-api) trust the requests it forwards by this
	// certificate's name.
	proxyClientCert, proxyClientKey, err := k.pki.issue("front-proxy-client", "front-proxy-client", nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	saPub, saKey, err := k.pki.serviceAccountKeys()
	if err != nil {
		t.Fatal(err)
	}
	must := func(path string, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return path
	}
	k.admin = must(k.pki.kubeconfig("admin", server, "kubernetes-admin", "system:masters"))
	cmConfig := must(k.pki.kubeconfig("controller-manager", server, "system:kube-controller-manager"))
	schedConfig := must(k.pki.kubeconfig("scheduler", server, "system:kube-scheduler"))
	kubeletConfig := must(k.pki.kubeconfig("kubelet", server, "system:node:"+nodeName, "system:nodes"))
	proxyConfig := must(k.pki.kubeconfig("kube-proxy", server, "system:kube-proxy"))
	kubeletCert, kubeletKey, err := k.pki.issue("kubelet-serving", "system:node:"+nodeName, []string{"system:nodes"},
		[]string{nodeName}, []net.IP{net.ParseIP(nodeIP)})
	if err != nil {
		t.Fatal(err)
	}

	k.start("etcd", k.bins["etcd"], "--name", "e2e", "--data-dir", filepath.Join(k.work, "etcd"),
		"--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
		"--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
		"--initial-cluster", "e2e=http://127.0.0.1:2380", "--unsafe-no-fsync")
	var o kubeOptions
	if len(opts) > 0 {
		o = opts[0]
	}
	var gates []string
	if o.featureGates != "" {
		gates = []string{"--feature-gates", o.featureGates}
	}
	apiArgs := []string{
		"--etcd-servers", "http://127.0.0.1:2379",
		"--advertise-address", nodeIP, "--bind-address", "0.0.0.0", "--secure-port", "6443",
		"--tls-cert-file", apiCert, "--tls-private-key-file", apiKey, "--client-ca-file", k.pki.CAFile,
		"--kubelet-client-certificate", kubeletClientCert, "--kubelet-client-key", kubeletClientKey,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", saPub, "--service-account-signing-key-file", saKey,
		"--service-cluster-ip-range", serviceCIDR, "--authorization-mode", "Node,RBAC",
		"--allow-privileged=true", "--enable-aggregator-routing=true",
		"--requestheader-client-ca-file", k.pki.CAFile, "--requestheader-allowed-names", "front-proxy-client",
		"--requestheader-username-headers", "X-Remote-User", "--requestheader-group-headers", "X-Remote-Group",
		"--requestheader-extra-headers-prefix", "X-Remote-Extra-",
		"--proxy-client-cert-file", proxyClientCert, "--proxy-client-key-file", proxyClientKey,
		// The node's name resolves nowhere: reach kubelets by address.
		"--kubelet-preferred-address-types=InternalIP"}
	k.start("kube-apiserver", append(append([]string{k.bins["kube-apiserver"]}, apiArgs...), gates...)...)
	k.waitFor("the API server", 3*time.Minute, func() error {
		_, err := k.kubectl("get", "--raw", "/readyz")
		return err
	})
	k.start("kube-controller-manager", k.bins["kube-controller-manager"], "--kubeconfig", cmConfig,
		"--authentication-kubeconfig", cmConfig, "--authorization-kubeconfig", cmConfig,
		"--service-account-private-key-file", saKey, "--root-ca-file", k.pki.CAFile,
		"--use-service-account-credentials=true", "--leader-elect=false", "--bind-address", "127.0.0.1",
		"--cluster-signing-cert-file", k.pki.CAFile, "--cluster-signing-key-file", filepath.Join(k.work, "pki", "ca.key"))
	k.start("kube-scheduler", k.bins["kube-scheduler"], "--kubeconfig", schedConfig,
		"--authentication-kubeconfig", schedConfig, "--authorization-kubeconfig", schedConfig,
		"--leader-elect=false", "--bind-address", "127.0.0.1")

	k.startContainerd(o.podPIDNamespace)
	k.startKubelet(kubeletConfig, kubeletCert, kubeletKey, gates...)
	k.startProxy(proxyConfig)
	k.waitFor("the node Ready", 3*time.Minute, func() error {
		out, err := k.kubectl("get", "node", nodeName, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		if err != nil {
			return err
		}
		if string(out) != "True" {
			return fmt.Errorf("Ready=%q", out)
		}
		return nil
	})
	return k
}

// network makes the namespace: loopback, the node's address, a default
// route, forwarding and bridged traffic through iptables (kube-proxy).
func (k *kube) network() {
	k.t.Helper()
	for _, args := range [][]string{
		{"netns", "add", k.ns},
		{"-n", k.ns, "link", "set", "lo", "up"},
		{"-n", k.ns, "link", "add", "node0", "type", "veth", "peer", "name", "node1"},
		{"-n", k.ns, "link", "set", "node0", "up"},
		{"-n", k.ns, "link", "set", "node1", "up"},
		{"-n", k.ns, "addr", "add", nodeIP + "/24", "dev", "node0"},
		{"-n", k.ns, "route", "add", "default", "dev", "node0"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			k.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	for _, kv := range []string{"net.ipv4.ip_forward=1", "net.bridge.bridge-nf-call-iptables=1"} {
		if out, err := exec.Command("ip", "netns", "exec", k.ns, "sysctl", "-w", kv).CombinedOutput(); err != nil {
			k.t.Fatalf("sysctl %s: %v: %s", kv, err, out)
		}
	}
}

func (k *kube) startContainerd(ownPIDNamespace bool) {
	k.t.Helper()
	k.ctrSock = filepath.Join(k.run, "containerd.sock")
	cni := filepath.Join(k.work, "cni")
	conf := fmt.Sprintf(`{"cniVersion": "0.4.0", "name": "e2e", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": %q}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
`, podCIDR, filepath.Join(k.work, "cni-ipam"))
	if err := os.WriteFile(filepath.Join(cni, "10-e2e.conflist"), []byte(conf), 0o644); err != nil {
		k.t.Fatal(err)
	}
	cfg := fmt.Sprintf(`version = 2
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
`, filepath.Join(k.work, "containerd"), filepath.Join(k.run, "containerd"), k.ctrSock,
		filepath.Join(k.work, "containerd-opt"), pauseImage, cni)
	path := filepath.Join(k.work, "containerd.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		k.t.Fatal(err)
	}
	k.netnsBefore = map[string]bool{}
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 0 {
				k.netnsBefore[f[0]] = true
			}
		}
	}
	argv := []string{"containerd", "--config", path}
	if ownPIDNamespace {
		// A mount namespace of its own for the new /proc only: its mounts
		// keep their propagation, so the shared directories of the test
		// stay shared with the kubelet's.
		argv = append([]string{"unshare", "--pid", "--fork", "--kill-child", "--mount", "--propagation", "unchanged", "--mount-proc", "--"}, argv...)
	}
	k.start("containerd", argv...)
	k.waitFor("containerd", time.Minute, func() error {
		_, err := k.ctr("version")
		return err
	})
}

func (k *kube) startKubelet(kubeconfig, cert, key string, extra ...string) {
	k.t.Helper()
	k.KubeletDir = filepath.Join(k.work, "kubelet")
	if err := os.MkdirAll(k.KubeletDir, 0o750); err != nil {
		k.t.Fatal(err)
	}
	resolv := filepath.Join(k.work, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver "+nodeIP+"\n"), 0o644); err != nil {
		k.t.Fatal(err)
	}
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %q}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
clusterDNS: [%q]
clusterDomain: cluster.local
containerRuntimeEndpoint: unix://%s
failSwapOn: false
resolvConf: %q
tlsCertFile: %q
tlsPrivateKeyFile: %q
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
`, k.pki.CAFile, dnsIP, k.ctrSock, resolv, cert, key)
	path := filepath.Join(k.work, "kubelet.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		k.t.Fatal(err)
	}
	k.start("kubelet", append([]string{k.bins["kubelet"], "--config", path, "--kubeconfig", kubeconfig, "--root-dir", k.KubeletDir,
		"--hostname-override", nodeName, "--node-ip", nodeIP}, extra...)...)
}

func (k *kube) startProxy(kubeconfig string) {
	k.t.Helper()
	cfg := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %q}
mode: iptables
clusterCIDR: %q
hostnameOverride: %q
iptables: {masqueradeAll: true}
conntrack: {maxPerCore: 0}
`, kubeconfig, podCIDR, nodeName)
	path := filepath.Join(k.work, "kube-proxy.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		k.t.Fatal(err)
	}
	k.start("kube-proxy", k.bins["kube-proxy"], "--config", path)
}

// start runs argv in the node's network namespace, its output in a log.
func (k *kube) start(name string, argv ...string) *proc {
	k.t.Helper()
	logPath := filepath.Join(k.work, "logs", name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		k.t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command("nsenter", append([]string{"--net=/run/netns/" + k.ns, "--"}, argv...)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		k.t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{}), log: logPath}
	go func() { cmd.Wait(); close(p.done) }()
	k.procs = append(k.procs, p)
	return p
}

// stop ends p: SIGTERM, then SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

// kubectl runs kubectl as the cluster's admin.
func (k *kube) kubectl(args ...string) ([]byte, error) {
	return k.kubectlIn(nil, args...)
}

func (k *kube) kubectlIn(stdin []byte, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=/run/netns/" + k.ns, "--", k.bins["kubectl"],
		"--kubeconfig", k.admin}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return bytes.TrimSpace(out), nil
}

// apply applies manifests given as YAML text.
func (k *kube) apply(yamlText string) {
	k.t.Helper()
	if out, err := k.kubectlIn([]byte(yamlText), "apply", "-f", "-"); err != nil {
		k.t.Fatalf("%v\n%s", err, out)
	}
}

// ctr runs containerd's ctr in the Kubernetes namespace of images.
func (k *kube) ctr(args ...string) ([]byte, error) {
	cmd := exec.Command("ctr", append([]string{"--address", k.ctrSock, "--namespace", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("ctr %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return out, nil
}

// waitFor polls check until it succeeds or timeout passes, then fails the
// test with its last error and the tail of every log.
func (k *kube) waitFor(what string, timeout time.Duration, check func() error) {
	k.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			k.dumpLogs()
			k.t.Fatalf("waiting for %s: %v", what, err)
		}
		for _, p := range k.procs {
			select {
			case <-p.done:
				k.dumpLogs()
				k.t.Fatalf("waiting for %s: %s exited (%v)", what, p.name, p.cmd.ProcessState)
			default:
			}
		}
		time.Sleep(time.Second)
	}
}

// dumpLogs prints the last lines of each process's log.
func (k *kube) dumpLogs() {
	for _, p := range k.procs {
		k.t.Logf("--- %s (%s), last lines:\n%s", p.name, p.log, tail(p.log, 25))
	}
}

func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// teardown stops the kubelet first (so nothing restarts), then every
// container of the cluster, then the control plane; it unmounts what the
// kubelet left and removes the namespaces. Leftovers are reported, not
// hidden: a later run must start clean.
func (k *kube) teardown() {
	if k.t.Failed() {
		k.dumpLogs()
	}
	byName := map[string]*proc{}
	for _, p := range k.procs {
		byName[p.name] = p
	}
	if p := byName["kubelet"]; p != nil {
		p.stop(15 * time.Second)
	}
	if k.ctrSock != "" && byName["containerd"] != nil {
		out, _ := k.ctr("tasks", "ls", "-q")
		for _, id := range strings.Fields(string(out)) {
			_, _ = k.ctr("tasks", "kill", "-s", "SIGKILL", id)
		}
		deadline := time.Now().Add(20 * time.Second)
		for _, id := range strings.Fields(string(out)) {
			for {
				if _, err := k.ctr("tasks", "delete", id); err == nil || time.Now().After(deadline) {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
	}
	for i := len(k.procs) - 1; i >= 0; i-- {
		k.procs[i].stop(10 * time.Second)
	}
	// containerd's shims outlive containerd; they serve only this run's
	// socket, so they are found by it.
	if k.ctrSock != "" {
		_ = exec.Command("pkill", "-KILL", "-f", "containerd-shim-runc-v2 .*-address "+k.ctrSock).Run()
	}
	for _, dir := range k.shared {
		if out, err := exec.Command("umount", "-R", "-l", dir).CombinedOutput(); err != nil {
			k.t.Logf("umount %s: %v: %s", dir, err, out)
		}
	}
	// The pods' network namespaces that this run's containerd made (cni-*)
	// and left.
	if out, err := exec.Command("ip", "netns", "list").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "cni-") && !k.netnsBefore[f[0]] {
				_ = exec.Command("ip", "netns", "del", f[0]).Run()
			}
		}
	}
	_ = exec.Command("ip", "netns", "del", k.ns).Run()
	if os.Getenv("QUIVER_E2E_KEEP") == "" {
		// A volume the endpoint still published when the test stopped
		// keeps its immutable placeholder, which not even root unlinks.
		dirs, _ := filepath.Glob(filepath.Join(k.work, "endpoint", "volumes", "*"))
		for _, dir := range dirs {
			if err := endpoint.RemovePlaceholder(dir); err != nil {
				k.t.Log(err)
			}
		}
		_ = os.RemoveAll(k.run)
		if err := os.RemoveAll(k.work); err != nil {
			k.t.Logf("remove %s: %v", k.work, err)
		}
	} else {
		k.t.Logf("kept %s (QUIVER_E2E_KEEP)", k.work)
	}
}
