package webhook

import (
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/tlscert/certtest"
)

const mwcPath = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/quiver-kubevirt"

// mwc is a configuration of two webhooks: one with a stale bundle, one
// with none.
const mwc = `{"apiVersion":"admissionregistration.k8s.io/v1","kind":"MutatingWebhookConfiguration",
 "metadata":{"name":"quiver-kubevirt","resourceVersion":"7"},
 "webhooks":[
  {"name":"disks.kubevirt.quiver.io","clientConfig":{"service":{"name":"w","namespace":"q"},"caBundle":"c3RhbGU="},"sideEffects":"None","admissionReviewVersions":["v1"]},
  {"name":"other.kubevirt.quiver.io","clientConfig":{"service":{"name":"w","namespace":"q"}},"sideEffects":"None","admissionReviewVersions":["v1"]}]}`

func bundles(t *testing.T, f *fakeAPI) []string {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, w := range f.objects[mwcPath]["webhooks"].([]any) {
		cc := w.(map[string]any)["clientConfig"].(map[string]any)
		s, _ := cc["caBundle"].(string)
		out = append(out, s)
	}
	return out
}

// TestEnsureCABundle writes a CA into every webhook of the configuration
// through a fake API server over TLS with a kubeconfig: the stale and the
// missing bundle are both set (base64 of the PEM on the wire, as caBundle
// is), a second run changes nothing and sends no patch, and a concurrent
// change between read and patch (the resourceVersion test fails) is read
// again, not overwritten.
func TestEnsureCABundle(t *testing.T) {
	ca := certtest.NewCA(t, "webhook-ca")
	want := base64.StdEncoding.EncodeToString(ca.PEM)
	api := newFakeAPI(t, "sa-token", map[string]string{mwcPath: mwc})
	k, err := NewKube(api.kubeconfig(t))
	if err != nil {
		t.Fatal(err)
	}
	n, err := k.EnsureCABundle(t.Context(), "quiver-kubevirt", ca.PEM)
	if err != nil || n != 2 {
		t.Fatalf("EnsureCABundle: %d, %v; want 2 changed", n, err)
	}
	for i, got := range bundles(t, api) {
		if got != want {
			t.Errorf("webhook %d: caBundle %.20q..., want the CA", i, got)
		}
	}
	if n, err := k.EnsureCABundle(t.Context(), "quiver-kubevirt", ca.PEM); err != nil || n != 0 || api.patches != 1 {
		t.Errorf("second run: %d, %v, %d patches in all; want 0 changed and no new patch", n, err, api.patches)
	}

	// Another writer changes the object between our read and our patch,
	// once: the patch's resourceVersion test fails and we read again.
	other := certtest.NewCA(t, "rotated-ca")
	raced := false
	api.beforePatch = func(obj map[string]any) {
		if !raced {
			raced = true
			meta := obj["metadata"].(map[string]any)
			meta["resourceVersion"] = "100"
			obj["metadata"] = meta
		}
	}
	before := api.patches
	if n, err := k.EnsureCABundle(t.Context(), "quiver-kubevirt", other.PEM); err != nil || n != 2 {
		t.Fatalf("after a concurrent change: %d, %v", n, err)
	}
	if api.patches-before != 2 {
		t.Errorf("%d patches; want 2 (the refused one, then the one after reading again)", api.patches-before)
	}
	for i, got := range bundles(t, api) {
		if got != base64.StdEncoding.EncodeToString(other.PEM) {
			t.Errorf("webhook %d: not the rotated CA", i)
		}
	}
}

// TestEnsureCABundleRefuses: a bundle that is no CA is refused before any
// request; a configuration that does not exist, or an API error, is an
// error naming the configuration.
func TestEnsureCABundleRefuses(t *testing.T) {
	ca := certtest.NewCA(t, "webhook-ca")
	leaf := ca.Server(t, false, "w.q.svc")
	api := newFakeAPI(t, "sa-token", map[string]string{mwcPath: mwc})
	k, err := NewKube(api.kubeconfig(t))
	if err != nil {
		t.Fatal(err)
	}
	for name, bundle := range map[string][]byte{"leaf": leaf.Cert, "garbage": []byte("not pem"), "empty": nil} {
		if _, err := k.EnsureCABundle(t.Context(), "quiver-kubevirt", bundle); !errors.Is(err, ErrBadCA) {
			t.Errorf("%s: %v, want ErrBadCA", name, err)
		}
	}
	if api.patches != 0 {
		t.Errorf("%d patches for refused bundles", api.patches)
	}
	if _, err := k.EnsureCABundle(t.Context(), "nope", ca.PEM); err == nil || !strings.Contains(err.Error(), "nope does not exist") {
		t.Errorf("missing configuration: %v", err)
	}
	api.status[mwcPath] = http.StatusForbidden
	if _, err := k.EnsureCABundle(t.Context(), "quiver-kubevirt", ca.PEM); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("forbidden: %v", err)
	}
}
