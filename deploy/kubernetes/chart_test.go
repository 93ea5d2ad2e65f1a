package manifests

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	snapv1 "github.com/kubernetes-csi/external-snapshotter/client/v8/apis/volumesnapshot/v1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"sigs.k8s.io/yaml"

	"github.com/quiverstorage/quiver/internal/kubevirt/webhook"
)

// The chart, rendered as the release "quiver" in the manifests' namespace,
// so that names and namespaces compare with deploy/kubernetes as they are.
const (
	chartDir  = "../helm/quiver"
	release   = "quiver"
	namespace = "quiver-system"
)

var (
	helmOnce sync.Once
	helmPath string
	helmErr  error
)

// helm returns the Helm CLI of scripts/helm (built from helm.sh/helm/v4 into
// the cache on first use: minutes, once). The test skips when it cannot be
// built, and fails when CI is set.
func helm(t *testing.T) string {
	t.Helper()
	helmOnce.Do(func() {
		var stderr bytes.Buffer
		cmd := exec.Command("../../scripts/helm")
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			helmErr = fmt.Errorf("scripts/helm: %v: %s", err, stderr.String())
			return
		}
		helmPath = strings.TrimSpace(string(out))
	})
	if helmErr != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("helm: %v", helmErr)
		}
		t.Skipf("helm cannot be built here: %v", helmErr)
	}
	return helmPath
}

// runHelm runs helm with args; it returns stdout, stderr and the error.
func runHelm(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(helm(t), args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// No user's Helm configuration or repositories.
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home+"/config", "HELM_CACHE_HOME="+home+"/cache", "HELM_DATA_HOME="+home+"/data")
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// render is helm template of the chart with the --set values; it fails the
// test if Helm refuses them.
func render(t *testing.T, set ...string) []object {
	t.Helper()
	out, stderr, err := runHelm(t, templateArgs(set)...)
	if err != nil {
		t.Fatalf("helm template %v: %v: %s", set, err, stderr)
	}
	return decodeStream(t, "helm template "+strings.Join(set, " "), []byte(out))
}

func templateArgs(set []string) []string {
	args := []string{"template", release, chartDir, "--namespace", namespace}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return args
}

// Value sets: the install modes the chart offers.
var valueSets = map[string][]string{
	"defaults":     nil,
	"external":     {"storage.node.enabled=false", "storage.external.address=http://10.0.0.5:7480", "token.existingSecret=site-token", "token.key=api"},
	"webhook off":  {"webhook.enabled=false"},
	"cert-manager": {"webhook.certManager.enabled=true"},
	"own secrets":  {"token.existingSecret=site-token", "webhook.existingSecret=site-webhook-tls"},
	"host network": {"storage.node.hostNetwork=true", "storage.node.address=http://192.0.2.7:7480", "storage.node.nbdAddress=192.0.2.7:10809"},
}

// TestChartLint: helm lint --strict passes with every value set.
func TestChartLint(t *testing.T) {
	for name, set := range valueSets {
		args := []string{"lint", "--strict", chartDir, "--namespace", namespace}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		if out, stderr, err := runHelm(t, args...); err != nil {
			t.Errorf("%s: helm lint --strict: %v\n%s%s", name, err, out, stderr)
		}
	}
}

// find returns the objects of one Go type.
func find[T any](objs []object) []T {
	var out []T
	for _, o := range objs {
		if v, ok := o.obj.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func named[T interface{ GetName() string }](objs []object, name string) T {
	for _, v := range find[T](objs) {
		if v.GetName() == name {
			return v
		}
	}
	var zero T
	return zero
}

// podSpecs are the pod templates of every workload, by "Kind/name".
func podSpecs(objs []object) map[string]*corev1.PodSpec {
	out := map[string]*corev1.PodSpec{}
	for _, o := range objs {
		switch w := o.obj.(type) {
		case *appsv1.Deployment:
			out["Deployment/"+w.Name] = &w.Spec.Template.Spec
		case *appsv1.DaemonSet:
			out["DaemonSet/"+w.Name] = &w.Spec.Template.Spec
		case *appsv1.StatefulSet:
			out["StatefulSet/"+w.Name] = &w.Spec.Template.Spec
		}
	}
	return out
}

// flagValues maps each "--flag=value" argument of a container to its value.
func flagValues(c corev1.Container) map[string]string {
	out := map[string]string{}
	for _, a := range c.Args {
		if k, v, ok := strings.Cut(a, "="); ok {
			out[k] = v
		} else if strings.HasPrefix(a, "--") {
			out[a] = ""
		}
	}
	return out
}

// TestChartDefaults: the default install passes the manifests' checks, and
// its token, certificate, images and RBAC are right.
func TestChartDefaults(t *testing.T) {
	objs := render(t)
	checkAgree(t, objs)
	checkToken(t, objs, release+"-api-token", "token", true)
	checkWebhookCert(t, objs)
	checkRBAC(t, objs, decodeAll(t))
	checkServiceAccounts(t, objs)
	chart, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(chart, &meta); err != nil || meta.AppVersion == "" {
		t.Fatalf("Chart.yaml: appVersion %q, %v", meta.AppVersion, err)
	}
	for name, pod := range podSpecs(objs) {
		for _, c := range pod.Containers {
			if c.ImagePullPolicy != corev1.PullIfNotPresent {
				t.Errorf("%s container %s: imagePullPolicy %q, want IfNotPresent (images are imported, not pulled)", name, c.Name, c.ImagePullPolicy)
			}
			if !strings.HasPrefix(c.Image, "registry.k8s.io/sig-storage/") && c.Image != "quiver:"+meta.AppVersion {
				t.Errorf("%s container %s: image %s, want quiver:<appVersion %s>", name, c.Name, c.Image, meta.AppVersion)
			}
		}
	}
	// The storage node: the token file the plugins use, its ports behind
	// the Service the plugins name.
	sts := named[*appsv1.StatefulSet](objs, release+"-storage")
	svc := named[*corev1.Service](objs, release)
	if sts == nil || svc == nil {
		t.Fatalf("no storage node StatefulSet %s-storage or Service %s", release, release)
	}
	server := flagValues(sts.Spec.Template.Spec.Containers[0])
	if server["--token-file"] != "/etc/quiver/token" || server["--listen"] != ":7480" || server["--nbd-listen"] != ":10809" {
		t.Errorf("storage node args %v", sts.Spec.Template.Spec.Containers[0].Args)
	}
	if !reflect.DeepEqual(svc.Spec.Selector, sts.Spec.Template.Labels) {
		t.Errorf("Service %s selects %v, the storage pods are %v", svc.Name, svc.Spec.Selector, sts.Spec.Template.Labels)
	}
	wantServer := fmt.Sprintf("http://%s.%s.svc:7480", svc.Name, namespace)
	checkAddresses(t, objs, wantServer, fmt.Sprintf("%s.%s.svc:10809", svc.Name, namespace))
}

// checkAddresses: every component names the quiver API and NBD server the
// chart was given.
func checkAddresses(t *testing.T, objs []object, api, nbd string) {
	t.Helper()
	n := 0
	for name, pod := range podSpecs(objs) {
		for _, c := range pod.Containers {
			f := flagValues(c)
			for _, k := range []string{"--server", "--servers"} {
				if v, ok := f[k]; ok {
					n++
					if v != api {
						t.Errorf("%s container %s: %s=%s, want %s", name, c.Name, k, v, api)
					}
				}
			}
			if v, ok := f["--nbd"]; ok && v != nbd {
				t.Errorf("%s container %s: --nbd=%s, want %s", name, c.Name, v, nbd)
			}
		}
	}
	if n < 3 {
		t.Errorf("only %d containers name the quiver API", n)
	}
}

// checkToken: the API token Secret exists (with a generated token when
// generated), or is not rendered when referenced, and every pod mounts it
// as /etc/quiver/token from the right key.
func checkToken(t *testing.T, objs []object, secret, key string, rendered bool) {
	t.Helper()
	s := named[*corev1.Secret](objs, secret)
	switch {
	case rendered && s == nil:
		t.Fatalf("no token Secret %s", secret)
	case rendered && len(s.Data["token"]) < 32:
		t.Errorf("Secret %s: token of %d bytes, want a generated one of 32 or more", secret, len(s.Data["token"]))
	case !rendered && s != nil:
		t.Errorf("Secret %s rendered, but it is the user's", secret)
	}
	n := 0
	for name, pod := range podSpecs(objs) {
		for _, v := range pod.Volumes {
			if v.Name != "api-token" {
				continue
			}
			n++
			want := &corev1.SecretVolumeSource{SecretName: secret, Items: []corev1.KeyToPath{{Key: key, Path: "token"}}}
			if !reflect.DeepEqual(v.Secret, want) {
				t.Errorf("%s: api-token volume %+v, want %+v", name, v.Secret, want)
			}
		}
		for _, c := range pod.Containers {
			if f := flagValues(c); f["--token-file"] != "" {
				if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
					return m.Name == "api-token" && m.MountPath+"/token" == f["--token-file"]
				}) {
					t.Errorf("%s container %s: --token-file %s is not the api-token volume's", name, c.Name, f["--token-file"])
				}
			}
		}
	}
	if n < 4 {
		t.Errorf("%d pods mount the API token, want every quiver component's", n)
	}
}

// webhookParts are the webhook's configuration, Deployment and the Secret
// its tls volume names.
func webhookParts(t *testing.T, objs []object) (*admissionregistrationv1.MutatingWebhookConfiguration, *appsv1.Deployment, string) {
	t.Helper()
	mwcs := find[*admissionregistrationv1.MutatingWebhookConfiguration](objs)
	if len(mwcs) != 1 || len(mwcs[0].Webhooks) != 1 || mwcs[0].Webhooks[0].ClientConfig.Service == nil {
		t.Fatalf("want one MutatingWebhookConfiguration with one webhook on a Service, have %d", len(mwcs))
	}
	mwc := mwcs[0]
	ref := mwc.Webhooks[0].ClientConfig.Service
	svc := named[*corev1.Service](objs, ref.Name)
	if svc == nil || svc.Namespace != ref.Namespace {
		t.Fatalf("webhook Service %s/%s not rendered", ref.Namespace, ref.Name)
	}
	var dep *appsv1.Deployment
	for _, d := range find[*appsv1.Deployment](objs) {
		if reflect.DeepEqual(d.Spec.Template.Labels, svc.Spec.Selector) {
			dep = d
		}
	}
	if dep == nil {
		t.Fatalf("no Deployment behind Service %s (selector %v)", svc.Name, svc.Spec.Selector)
	}
	secret := ""
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Name == "tls" && v.Secret != nil {
			secret = v.Secret.SecretName
		}
	}
	f := flagValues(dep.Spec.Template.Spec.Containers[0])
	if secret == "" || f["--tls-cert"] != "/etc/quiver-webhook/tls.crt" || f["--tls-key"] != "/etc/quiver-webhook/tls.key" {
		t.Fatalf("webhook: tls volume %q, args %v", secret, dep.Spec.Template.Spec.Containers[0].Args)
	}
	return mwc, dep, secret
}

// checkWebhookCert: the caBundle is a PEM CA, and the serving certificate
// in the Secret the webhook mounts verifies against it for the Service's
// DNS name, with its key.
func checkWebhookCert(t *testing.T, objs []object) {
	t.Helper()
	mwc, _, secretName := webhookParts(t, objs)
	w := mwc.Webhooks[0]
	roots, err := webhook.CheckCA(w.ClientConfig.CABundle)
	if err != nil {
		t.Fatalf("caBundle: %v", err)
	}
	secret := named[*corev1.Secret](objs, secretName)
	if secret == nil {
		t.Fatalf("webhook Secret %s not rendered", secretName)
	}
	pair, err := tls.X509KeyPair(secret.Data["tls.crt"], secret.Data["tls.key"])
	if err != nil {
		t.Fatalf("Secret %s: %v", secretName, err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	dns := w.ClientConfig.Service.Name + "." + w.ClientConfig.Service.Namespace + ".svc"
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: dns, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("serving certificate for %s: %v", dns, err)
	}
	if !bytes.Equal(secret.Data["ca.crt"], w.ClientConfig.CABundle) {
		t.Errorf("Secret %s: ca.crt is not the caBundle", secretName)
	}
}

// checkServiceAccounts: every pod's service account is rendered.
func checkServiceAccounts(t *testing.T, objs []object) {
	t.Helper()
	for name, pod := range podSpecs(objs) {
		if sa := pod.ServiceAccountName; sa != "" && named[*corev1.ServiceAccount](objs, sa) == nil {
			t.Errorf("%s: service account %s not rendered", name, sa)
		}
	}
}

// grant is one permission: a service account may do verb on a resource
// (of a group, by name when resourceNames restricts it), in a namespace or
// cluster-wide ("*").
type grant struct{ sa, ns, group, resource, name, verb string }

// grants expands the RBAC objects into the permissions of each service
// account.
func grants(objs []object) map[grant]bool {
	roles := map[string][]rbacv1.PolicyRule{} // "ClusterRole/name" or "Role/ns/name"
	for _, r := range find[*rbacv1.ClusterRole](objs) {
		roles["ClusterRole/"+r.Name] = r.Rules
	}
	for _, r := range find[*rbacv1.Role](objs) {
		roles["Role/"+r.Namespace+"/"+r.Name] = r.Rules
	}
	out := map[grant]bool{}
	add := func(subjects []rbacv1.Subject, rules []rbacv1.PolicyRule, ns string) {
		for _, s := range subjects {
			if s.Kind != "ServiceAccount" {
				continue
			}
			for _, r := range rules {
				names := r.ResourceNames
				if len(names) == 0 {
					names = []string{""}
				}
				for _, g := range r.APIGroups {
					for _, res := range r.Resources {
						for _, v := range r.Verbs {
							for _, n := range names {
								out[grant{s.Namespace + "/" + s.Name, ns, g, res, n, v}] = true
							}
						}
					}
				}
			}
		}
	}
	for _, b := range find[*rbacv1.ClusterRoleBinding](objs) {
		add(b.Subjects, roles["ClusterRole/"+b.RoleRef.Name], "*")
	}
	for _, b := range find[*rbacv1.RoleBinding](objs) {
		key := "Role/" + b.Namespace + "/" + b.RoleRef.Name
		if b.RoleRef.Kind == "ClusterRole" {
			key = "ClusterRole/" + b.RoleRef.Name
		}
		add(b.Subjects, roles[key], b.Namespace)
	}
	return out
}

// checkRBAC: each service account of the chart may do exactly what the
// manifests' same account may (deploy/kubernetes/02-rbac.yaml and the
// webhook's role: what each sidecar and the webhook call), no less and no
// more.
func checkRBAC(t *testing.T, chart, manifests []object) {
	t.Helper()
	got, want := grants(chart), grants(manifests)
	if len(want) < 50 {
		t.Fatalf("the manifests grant only %d permissions", len(want))
	}
	diff := func(a, b map[grant]bool) []string {
		var out []string
		for g := range a {
			if !b[g] {
				out = append(out, fmt.Sprintf("%+v", g))
			}
		}
		sort.Strings(out)
		return out
	}
	for _, g := range diff(want, got) {
		t.Errorf("chart lacks %s", g)
	}
	for _, g := range diff(got, want) {
		t.Errorf("chart grants more than the manifests: %s", g)
	}
}

// TestChartExternalStorage: with an external quiver server and the user's
// token Secret, no storage node is run, every component names that server,
// and mounts that Secret's key.
func TestChartExternalStorage(t *testing.T) {
	objs := render(t, valueSets["external"]...)
	checkAgree(t, objs)
	if named[*appsv1.StatefulSet](objs, release+"-storage") != nil || named[*corev1.Service](objs, release) != nil {
		t.Error("a storage node is rendered with storage.external")
	}
	checkAddresses(t, objs, "http://10.0.0.5:7480", "10.0.0.5:10809")
	checkToken(t, objs, "site-token", "api", false)
	if named[*corev1.Secret](objs, release+"-api-token") != nil {
		t.Error("a token Secret is generated beside token.existingSecret")
	}
}

// TestChartStorageHostNetwork: the storage node on the node's network,
// with the address the components use given.
func TestChartStorageHostNetwork(t *testing.T) {
	objs := render(t, valueSets["host network"]...)
	sts := named[*appsv1.StatefulSet](objs, release+"-storage")
	if sts == nil || !sts.Spec.Template.Spec.HostNetwork || sts.Spec.Template.Spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
		t.Fatalf("storage node not on the host network with cluster DNS")
	}
	checkAddresses(t, objs, "http://192.0.2.7:7480", "192.0.2.7:10809")
	if named[*appsv1.StatefulSet](render(t), release+"-storage").Spec.Template.Spec.HostNetwork {
		t.Error("storage node on the host network by default")
	}
}

// TestChartWebhookOff: no webhook object at all.
func TestChartWebhookOff(t *testing.T) {
	objs := render(t, valueSets["webhook off"]...)
	if len(find[*admissionregistrationv1.MutatingWebhookConfiguration](objs)) != 0 {
		t.Error("MutatingWebhookConfiguration rendered with webhook.enabled=false")
	}
	for _, o := range objs {
		if m, ok := o.obj.(interface{ GetName() string }); ok && strings.Contains(m.GetName(), "webhook") {
			t.Errorf("%s %s rendered with webhook.enabled=false", o.kind, m.GetName())
		}
	}
	if len(podSpecs(objs)) != 4 {
		t.Errorf("%d workloads, want storage, controller, node plugin and endpoint", len(podSpecs(objs)))
	}
}

// TestChartCertManager: cert-manager issues the webhook's certificate for
// the Service's names, into the Secret the webhook mounts, from a CA whose
// Issuer is rendered; its CA injector is told which Certificate's CA goes
// into caBundle, and Helm writes none.
func TestChartCertManager(t *testing.T) {
	objs := render(t, valueSets["cert-manager"]...)
	mwc, _, secretName := webhookParts(t, objs)
	w := mwc.Webhooks[0]
	if len(w.ClientConfig.CABundle) != 0 {
		t.Error("caBundle written by Helm with cert-manager")
	}
	if named[*corev1.Secret](objs, secretName) != nil {
		t.Errorf("Secret %s rendered by Helm with cert-manager", secretName)
	}
	ns, name, _ := strings.Cut(mwc.Annotations["cert-manager.io/inject-ca-from"], "/")
	cert := named[*cmCertificate](objs, name)
	if cert == nil || cert.Namespace != ns {
		t.Fatalf("inject-ca-from %q names no rendered Certificate", mwc.Annotations["cert-manager.io/inject-ca-from"])
	}
	if cert.Spec.SecretName != secretName {
		t.Errorf("Certificate %s writes Secret %s, the webhook mounts %s", cert.Name, cert.Spec.SecretName, secretName)
	}
	dns := w.ClientConfig.Service.Name + "." + w.ClientConfig.Service.Namespace + ".svc"
	if !slices.Contains(cert.Spec.DNSNames, dns) {
		t.Errorf("Certificate %s: dnsNames %v lack %s", cert.Name, cert.Spec.DNSNames, dns)
	}
	issuer := named[*cmIssuer](objs, cert.Spec.IssuerRef.Name)
	if cert.Spec.IssuerRef.Kind != "Issuer" || issuer == nil || issuer.Spec.CA == nil {
		t.Fatalf("Certificate %s: issuer %+v is no rendered CA Issuer", cert.Name, cert.Spec.IssuerRef)
	}
	var ca *cmCertificate
	for _, c := range find[*cmCertificate](objs) {
		if c.Spec.SecretName == issuer.Spec.CA.SecretName {
			ca = c
		}
	}
	if ca == nil || !ca.Spec.IsCA {
		t.Fatalf("Issuer %s: its CA Secret %s is issued by no CA Certificate", issuer.Name, issuer.Spec.CA.SecretName)
	}
	if root := named[*cmIssuer](objs, ca.Spec.IssuerRef.Name); root == nil || root.Spec.SelfSigned == nil {
		t.Errorf("CA Certificate %s: issuer %s is no rendered self-signed Issuer", ca.Name, ca.Spec.IssuerRef.Name)
	}
}

// TestChartOwnSecrets: with the user's token and webhook Secrets, Helm
// writes neither; the webhook is told to write its CA into its own
// configuration, and may patch that one and nothing else.
func TestChartOwnSecrets(t *testing.T) {
	objs := render(t, valueSets["own secrets"]...)
	checkToken(t, objs, "site-token", "token", false)
	mwc, dep, secretName := webhookParts(t, objs)
	if secretName != "site-webhook-tls" || named[*corev1.Secret](objs, secretName) != nil {
		t.Errorf("webhook mounts %s (rendered: %v), want the user's site-webhook-tls", secretName, named[*corev1.Secret](objs, secretName) != nil)
	}
	if len(mwc.Webhooks[0].ClientConfig.CABundle) != 0 {
		t.Error("caBundle written by Helm with the user's certificate")
	}
	f := flagValues(dep.Spec.Template.Spec.Containers[0])
	if f["--webhook-config"] != mwc.Name || f["--webhook-ca-file"] != "/etc/quiver-webhook/ca.crt" {
		t.Errorf("webhook args %v: want --webhook-config=%s --webhook-ca-file=/etc/quiver-webhook/ca.crt", dep.Spec.Template.Spec.Containers[0].Args, mwc.Name)
	}
	sa := namespace + "/" + dep.Spec.Template.Spec.ServiceAccountName
	var extra []grant
	for g := range grants(objs) {
		if g.sa == sa && g.group == "admissionregistration.k8s.io" {
			extra = append(extra, g)
		}
	}
	want := []grant{
		{sa, "*", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", mwc.Name, "get"},
		{sa, "*", "admissionregistration.k8s.io", "mutatingwebhookconfigurations", mwc.Name, "patch"},
	}
	sort.Slice(extra, func(i, j int) bool { return extra[i].verb < extra[j].verb })
	if !reflect.DeepEqual(extra, want) {
		t.Errorf("webhook's admissionregistration grants %+v, want %+v", extra, want)
	}
}

// TestChartImages: every container's image comes from values: set each to
// a name of its own, and every one is used and nothing else appears; the
// hook sidecar's image is the quiver image.
func TestChartImages(t *testing.T) {
	set := []string{"image.repository=reg.test/quiver", "image.tag=t-quiver", "image.pullPolicy=Never", "sidecars.pullPolicy=Always"}
	want := map[string]bool{"reg.test/quiver:t-quiver": false}
	for _, s := range []string{"provisioner", "attacher", "snapshotter", "resizer", "livenessProbe"} {
		set = append(set, "sidecars."+s+".image=reg.test/"+s, "sidecars."+s+".tag=t-"+s)
		want["reg.test/"+s+":t-"+s] = false
	}
	objs := render(t, set...)
	for name, pod := range podSpecs(objs) {
		for _, c := range pod.Containers {
			if _, ok := want[c.Image]; !ok {
				t.Errorf("%s container %s: image %s does not come from values", name, c.Name, c.Image)
			}
			want[c.Image] = true
			policy := corev1.PullAlways
			if c.Image == "reg.test/quiver:t-quiver" {
				policy = corev1.PullNever
			}
			if c.ImagePullPolicy != policy {
				t.Errorf("%s container %s: imagePullPolicy %s, want %s from values", name, c.Name, c.ImagePullPolicy, policy)
			}
			if f := flagValues(c); c.Name == "webhook" && (f["--sidecar-image"] != "reg.test/quiver:t-quiver" || f["--sidecar-pull-policy"] != "Never") {
				t.Errorf("webhook: hook sidecar image %s (%s), want the quiver image", f["--sidecar-image"], f["--sidecar-pull-policy"])
			}
		}
	}
	for image, used := range want {
		if !used {
			t.Errorf("image %s set in values but used by no container", image)
		}
	}
}

// TestChartRefusesBadValues: values that cannot make a working install
// fail at template time with a message naming the value.
func TestChartRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{[]string{"storage.node.enabled=false"}, "set storage.node.enabled=true (a storage node run by the chart) or storage.external.address"},
		{[]string{"storage.external.address=http://10.0.0.5:7480", "token.value=x"}, "set one of storage.node.enabled"},
		{[]string{"storage.node.enabled=false", "storage.external.address=http://10.0.0.5:7480"}, "with storage.external.address, set token.existingSecret"},
		{[]string{"storage.node.enabled=false", "storage.external.address=10.0.0.5:7480", "token.value=x"}, `storage.external.address "10.0.0.5:7480": want http://host:port`},
		{[]string{"token.existingSecret=a", "token.value=b"}, "set token.existingSecret or token.value, not both"},
		{[]string{"webhook.certManager.enabled=true", "webhook.existingSecret=a"}, "set webhook.certManager.enabled or webhook.existingSecret, not both"},
		// A --set of a list entry replaces the whole list.
		{[]string{"storageClasses[0].name=a", "storageClasses[0].volumeBindingMode=Later"}, `storageClasses[0] (a): volumeBindingMode "Later": want Immediate or WaitForFirstConsumer`},
		{[]string{"storageClasses[0].name=a", "storageClasses[1].name=a"}, `storageClasses[1]: name "a" is used twice`},
		{[]string{"storageClasses[1].name=b"}, `storageClasses[0]: want a map`},
		{[]string{"storage.node.address=http://192.0.2.7:7480"}, "storage.node: set both address and nbdAddress, or neither"},
		{[]string{"storage.node.address=192.0.2.7", "storage.node.nbdAddress=192.0.2.7:10809"}, `storage.node.address "192.0.2.7": want http://host:port`},
	} {
		_, stderr, err := runHelm(t, templateArgs(tc.set)...)
		if err == nil || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: %v, stderr %q; want a failure saying %q", tc.set, err, stderr, tc.want)
		}
	}
}

// TestChartMatchesManifests: the default install is what deploy/kubernetes
// installs (kept for kubectl users, with placeholders where the chart
// generates secrets): the same objects, plus the storage node; the same
// CSIDriver, classes, snapshot class and webhook rules; and in every
// workload the same containers, images, arguments (but the addresses,
// which the chart derives), mounts, host paths and privileges.
func TestChartMatchesManifests(t *testing.T) {
	chart, manifests := render(t), decodeAll(t)
	key := func(o object) string {
		m, _ := o.obj.(interface{ GetName() string })
		return o.kind + " " + m.GetName()
	}
	inChart := map[string]object{}
	for _, o := range chart {
		inChart[key(o)] = o
	}
	examples := map[string]bool{"v1/Namespace": true, "v1/PersistentVolumeClaim": true, "kubevirt.io/v1/VirtualMachine": true, "cdi.kubevirt.io/v1beta1/DataVolume": true}
	chartExtra := map[string]bool{"apps/v1/StatefulSet " + release + "-storage": true, "v1/Service " + release: true}
	seen := map[string]bool{}
	for _, m := range manifests {
		if examples[m.kind] {
			continue
		}
		k := key(m)
		seen[k] = true
		c, ok := inChart[k]
		if !ok {
			t.Errorf("%s (%s) is not in the chart", k, m.file)
			continue
		}
		compareObject(t, k, m.obj, c.obj)
	}
	for k := range inChart {
		if !seen[k] && !chartExtra[k] {
			t.Errorf("the chart has %s, deploy/kubernetes has not", k)
		}
	}
}

// addressFlags are derived from values by the chart; chartFlags are
// arguments only the chart passes (the manifests rely on the defaults).
var (
	addressFlags = map[string]bool{"--server": true, "--servers": true, "--nbd": true}
	chartFlags   = map[string]bool{"--driver-name": true, "--sidecar-pull-policy": true}
)

func compareObject(t *testing.T, k string, manifest, chart any) {
	t.Helper()
	switch m := manifest.(type) {
	case *storagev1.CSIDriver:
		if c := chart.(*storagev1.CSIDriver); !reflect.DeepEqual(m.Spec, c.Spec) {
			t.Errorf("%s: spec %+v, manifest %+v", k, c.Spec, m.Spec)
		}
	case *storagev1.StorageClass:
		c := chart.(*storagev1.StorageClass)
		if c.Provisioner != m.Provisioner || !reflect.DeepEqual(c.Parameters, m.Parameters) || !reflect.DeepEqual(c.VolumeBindingMode, m.VolumeBindingMode) ||
			!reflect.DeepEqual(c.AllowVolumeExpansion, m.AllowVolumeExpansion) || !reflect.DeepEqual(c.ReclaimPolicy, m.ReclaimPolicy) {
			t.Errorf("%s differs from the manifest", k)
		}
	case *snapv1.VolumeSnapshotClass:
		c := chart.(*snapv1.VolumeSnapshotClass)
		if c.Driver != m.Driver || c.DeletionPolicy != m.DeletionPolicy || !reflect.DeepEqual(c.Annotations, m.Annotations) {
			t.Errorf("%s differs from the manifest", k)
		}
	case *admissionregistrationv1.MutatingWebhookConfiguration:
		c := chart.(*admissionregistrationv1.MutatingWebhookConfiguration)
		mw, cw := slices.Clone(m.Webhooks), slices.Clone(c.Webhooks)
		for i := range mw {
			mw[i].ClientConfig.CABundle = nil
		}
		for i := range cw {
			cw[i].ClientConfig.CABundle = nil
		}
		if !reflect.DeepEqual(mw, cw) {
			t.Errorf("%s: webhooks differ from the manifest (caBundle aside):\nchart    %+v\nmanifest %+v", k, cw, mw)
		}
	case *appsv1.Deployment:
		comparePods(t, k, &m.Spec.Template.Spec, &chart.(*appsv1.Deployment).Spec.Template.Spec)
	case *appsv1.DaemonSet:
		c := chart.(*appsv1.DaemonSet)
		if c.Spec.UpdateStrategy.Type != m.Spec.UpdateStrategy.Type {
			t.Errorf("%s: updateStrategy %s, manifest %s", k, c.Spec.UpdateStrategy.Type, m.Spec.UpdateStrategy.Type)
		}
		comparePods(t, k, &m.Spec.Template.Spec, &c.Spec.Template.Spec)
	}
}

func comparePods(t *testing.T, k string, m, c *corev1.PodSpec) {
	t.Helper()
	if m.HostNetwork != c.HostNetwork || m.DNSPolicy != c.DNSPolicy || m.ServiceAccountName != c.ServiceAccountName {
		t.Errorf("%s: hostNetwork %v dnsPolicy %q serviceAccount %q; manifest %v %q %q", k, c.HostNetwork, c.DNSPolicy, c.ServiceAccountName, m.HostNetwork, m.DNSPolicy, m.ServiceAccountName)
	}
	hostPaths := func(p *corev1.PodSpec) map[string]corev1.HostPathVolumeSource {
		out := map[string]corev1.HostPathVolumeSource{}
		for _, v := range p.Volumes {
			if v.HostPath != nil {
				out[v.Name] = *v.HostPath
			}
		}
		return out
	}
	if !reflect.DeepEqual(hostPaths(m), hostPaths(c)) {
		t.Errorf("%s: host paths %v, manifest %v", k, hostPaths(c), hostPaths(m))
	}
	if len(m.Containers) != len(c.Containers) {
		t.Errorf("%s: %d containers, manifest %d", k, len(c.Containers), len(m.Containers))
	}
	for _, mc := range m.Containers {
		i := slices.IndexFunc(c.Containers, func(x corev1.Container) bool { return x.Name == mc.Name })
		if i < 0 {
			t.Errorf("%s: no container %s", k, mc.Name)
			continue
		}
		cc := c.Containers[i]
		where := k + " container " + mc.Name
		if cc.Image != mc.Image {
			t.Errorf("%s: image %s, manifest %s", where, cc.Image, mc.Image)
		}
		if !reflect.DeepEqual(cc.VolumeMounts, mc.VolumeMounts) || !reflect.DeepEqual(cc.SecurityContext, mc.SecurityContext) ||
			!reflect.DeepEqual(cc.Ports, mc.Ports) || !reflect.DeepEqual(cc.Env, mc.Env) {
			t.Errorf("%s: mounts, security context, ports or env differ from the manifest", where)
		}
		mf, cf := flagValues(mc), flagValues(cc)
		for f, v := range mf {
			if cv, ok := cf[f]; !ok {
				t.Errorf("%s: no %s", where, f)
			} else if cv != v && !addressFlags[f] {
				t.Errorf("%s: %s=%s, manifest %s", where, f, cv, v)
			}
		}
		for f := range cf {
			if _, ok := mf[f]; !ok && !chartFlags[f] {
				t.Errorf("%s: %s is not in the manifest", where, f)
			}
		}
		if len(mc.Args) > 0 && len(cc.Args) > 0 && mc.Args[0] != cc.Args[0] {
			t.Errorf("%s: command %s, manifest %s", where, cc.Args[0], mc.Args[0])
		}
	}
}
