package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/kubevirt"
)

// fakeClaims is an in-memory Claims: namespace/name -> claim.
type fakeClaims map[string]Claim

func (f fakeClaims) Claim(_ context.Context, ns, name string) (Claim, error) {
	c, ok := f[ns+"/"+name]
	if !ok {
		return Claim{}, ErrClaimNotFound
	}
	return c, nil
}

// fakeVolumes is an in-memory quiver API: volume -> disk names; a volume
// named "broken" fails; a volume named "cl-*" is kept by a cluster (it has
// a primary and copies); with the key onCluster the server is a cluster's
// node, with poolDown its pool cannot be read.
type fakeVolumes map[string][]string

const (
	onCluster = "@cluster"
	poolDown  = "@pooldown"
)

func (f fakeVolumes) GetVolume(_ context.Context, name string) (api.Volume, error) {
	if name == "broken" {
		return api.Volume{}, errors.New("connection refused")
	}
	disks, ok := f[name]
	if !ok {
		return api.Volume{}, fmt.Errorf("volume %s: not found", name)
	}
	v := api.Volume{Name: name}
	if strings.HasPrefix(name, "cl-") {
		v.Primary = "n1"
		v.Copies = []api.Copy{{Node: "n1"}, {Node: "n2"}}
	}
	for i, d := range disks {
		v.Disks = append(v.Disks, api.Disk{Name: d, Size: int64(i+1) << 30})
	}
	return v, nil
}

func (f fakeVolumes) Pool(context.Context) (api.PoolInfo, error) {
	if _, down := f[poolDown]; down {
		return api.PoolInfo{}, errors.New("connection refused")
	}
	if _, ok := f[onCluster]; ok {
		return api.PoolInfo{ID: "p", Cluster: "east"}, nil
	}
	return api.PoolInfo{ID: "p"}, nil
}

const image = "registry.example/quiver:1.0"

func testWebhook() *Webhook {
	return New(Config{
		Image: image,
		Claims: fakeClaims{
			"vms/vm1-disks":         {Driver: DefaultDriver, Volume: "pvc-1"},
			"vms/vm1-more":          {Driver: DefaultDriver, Volume: "pvc-2"},
			"vms/vm1-clash":         {Driver: DefaultDriver, Volume: "pvc-3"},
			"vms/vm1-block":         {Driver: DefaultDriver, Volume: "pvc-1", Block: true},
			"vms/vm1-block-pending": {Driver: DefaultDriver, Block: true},
			"vms/vm1-noprim":        {Driver: DefaultDriver, Volume: "pvc-4"},
			"vms/vm1-pending":       {Driver: DefaultDriver, ClassDisks: []string{"disk", "scratch"}},
			"vms/vm1-broken":        {Driver: DefaultDriver, Volume: "broken"},
			"vms/ceph-root":         {Driver: "rbd.csi.ceph.com", Volume: "0001-abc"},
			"vms/single":            {Driver: DefaultDriver, Volume: "pvc-5"},
			"vms/rootdisk":          {Driver: DefaultDriver, Volume: "pvc-7"},
			"vms/vm1-longname":      {Driver: DefaultDriver, Volume: "pvc-6"},
			"vms/vm1-cluster":       {Driver: DefaultDriver, Volume: "cl-1"},
			"vms/vm1-cluster-one":   {Driver: DefaultDriver, Volume: "cl-2"},
			"vms/vm1-cluster-block": {Driver: DefaultDriver, Volume: "cl-1", Block: true},
		},
		Volumes: fakeVolumes{
			"pvc-1": {"disk", "data", "logs"},
			"pvc-2": {"disk", "scratch"},
			"pvc-3": {"disk", "data"},
			"pvc-4": {"root", "data"},
			"pvc-5": {"disk"},
			"pvc-6": {"disk", "a-disk-name-over-twenty"},
			"pvc-7": {"disk", "swap"},
			"cl-1":  {"disk", "data", "logs"},
			"cl-2":  {"disk"},
		},
	})
}

func vmi(annotations string, volumes ...string) string {
	return fmt.Sprintf(`{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance","metadata":{"name":"vm1","namespace":"vms"%s},
"spec":{"domain":{"devices":{"disks":[{"name":"rootdisk","disk":{"bus":"virtio"}}]}},"volumes":[%s]}}`, annotations, strings.Join(volumes, ","))
}

func vm(template string) string {
	return fmt.Sprintf(`{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"vm1","namespace":"vms"},
"spec":{"runStrategy":"Always","template":%s}}`, template)
}

func pvc(volume, claim string) string {
	return fmt.Sprintf(`{"name":%q,"persistentVolumeClaim":{"claimName":%q}}`, volume, claim)
}

func review(kind, operation, object string) string {
	return fmt.Sprintf(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"705ab4f5-6393-11e8-b7cc-42010a800002",
"kind":{"group":"kubevirt.io","version":"v1","kind":%q},"resource":{"group":"kubevirt.io","version":"v1","resource":"x"},
"namespace":"vms","name":"vm1","operation":%q,"object":%s}}`, kind, operation, object)
}

// ourSidecar is the webhook's one sidecar entry: no "pvc" (KubeVirt would
// name the VM's claim twice in the launcher pod, and the kubelet never
// mounts the second), no --volume (it serves every volume).
func ourSidecar() map[string]any {
	return map[string]any{"image": image, "imagePullPolicy": "IfNotPresent", "command": []any{"quiver"},
		"args": []any{"kubevirt-hook"}}
}

// TestWebhook runs AdmissionReview JSON through the HTTP handler and applies
// the returned JSON Patch to the object.
func TestWebhook(t *testing.T) {
	userSidecar := `{"image":"smbios:1","imagePullPolicy":"Always","args":["--version","v1alpha3"],"configMap":{"name":"x","key":"y","hookPath":"/z"}}`
	userSidecars, _ := json.Marshal("[" + userSidecar + "]")
	cases := []struct {
		name   string
		body   string
		status int
		denied string // a substring of the refusal, "" when allowed
		// want: the annotations the patched object carries at annPath
		// (nil: no patch at all).
		annPath  []string
		extra    map[string][]string
		sidecars []any
		warning  string
		blocks   string // the block-disks annotation wanted, "" none
		served   string // the endpoint-disks annotation wanted, "" none
	}{
		{name: "VMI with a quiver PVC", body: review(KindVMI, "CREATE", vmi("", pvc("rootdisk", "vm1-disks"))),
			annPath: []string{"metadata", "annotations"}, extra: map[string][]string{"rootdisk": {"data", "logs"}},
			sidecars: []any{ourSidecar()}},
		{name: "VM with a quiver PVC, template without metadata",
			body:    review(KindVM, "CREATE", vm(`{"spec":{"volumes":[`+pvc("rootdisk", "vm1-disks")+`]}}`)),
			annPath: []string{"spec", "template", "metadata", "annotations"}, extra: map[string][]string{"rootdisk": {"data", "logs"}},
			sidecars: []any{ourSidecar()}},
		{name: "VM with a quiver PVC, template with annotations and a user sidecar",
			body: review(KindVM, "UPDATE", vm(`{"metadata":{"annotations":{"a":"b","hooks.kubevirt.io/hookSidecars":`+string(userSidecars)+`}},"spec":{"volumes":[`+
				pvc("rootdisk", "vm1-disks")+`]}}`)),
			annPath: []string{"spec", "template", "metadata", "annotations"}, extra: map[string][]string{"rootdisk": {"data", "logs"}},
			sidecars: []any{jsonValue(t, userSidecar), ourSidecar()}},
		{name: "VM with another driver's PVC is left unchanged",
			body: review(KindVM, "CREATE", vm(`{"spec":{"volumes":[`+pvc("rootdisk", "ceph-root")+`]}}`))},
		// On a single node a one-disk volume is KubeVirt's own disk.img.
		{name: "VMI with a one-disk quiver PVC on a single node is left unchanged",
			body: review(KindVMI, "CREATE", vmi("", pvc("rootdisk", "single")))},
		// A cluster's volume is staged at the compute node's endpoint:
		// every disk, a one-disk volume's too, on its socket.
		{name: "VMI with a cluster's quiver PVC: every disk through the endpoint",
			body:    review(KindVMI, "CREATE", vmi("", pvc("rootdisk", "vm1-cluster"))),
			annPath: []string{"metadata", "annotations"}, served: `{"rootdisk":["disk","data","logs"]}`, sidecars: []any{ourSidecar()}},
		{name: "VM with a cluster's one-disk quiver PVC: its disk through the endpoint",
			body:    review(KindVM, "CREATE", vm(`{"spec":{"volumes":[`+pvc("rootdisk", "vm1-cluster-one")+`]}}`)),
			annPath: []string{"spec", "template", "metadata", "annotations"}, served: `{"rootdisk":["disk"]}`, sidecars: []any{ourSidecar()}},
		{name: "VMI with a cluster's PVC and a single node's PVC", body: review(KindVMI, "CREATE", vmi("", pvc("rootdisk", "vm1-cluster"), pvc("more", "vm1-more"))),
			annPath: []string{"metadata", "annotations"}, extra: map[string][]string{"more": {"scratch"}}, served: `{"rootdisk":["disk","data","logs"]}`,
			sidecars: []any{ourSidecar()}},
		{name: "a cluster's Block-mode PVC stays a block layout", body: review(KindVMI, "CREATE", vmi("", pvc("rootdisk", "vm1-cluster-block"))),
			annPath:  []string{"metadata", "annotations"},
			blocks:   `{"rootdisk":[{"name":"disk","size":1073741824},{"name":"data","size":2147483648},{"name":"logs","size":3221225472}]}`,
			sidecars: []any{ourSidecar()}},
		{name: "VMI with a PVC that does not exist yet is left unchanged",
			body: review(KindVMI, "CREATE", vmi("", pvc("rootdisk", "nosuch")))},
		{name: "VMI with two quiver PVCs", body: review(KindVMI, "CREATE", vmi("", pvc("rootdisk", "vm1-disks"), pvc("more", "vm1-more"),
			`{"name":"cloudinitdisk","cloudInitNoCloud":{"userData":"x"}}`)),
			annPath: []string{"metadata", "annotations"}, extra: map[string][]string{"rootdisk": {"data", "logs"}, "more": {"scratch"}},
			sidecars: []any{ourSidecar()}},
		{name: "VMI with an unbound quiver PVC: disks from the StorageClass", body: review(KindVMI, "CREATE", vmi("", `{"name":"rootdisk","dataVolume":{"name":"vm1-pending"}}`)),
			annPath: []string{"metadata", "annotations"}, extra: map[string][]string{"rootdisk": {"scratch"}},
			sidecars: []any{ourSidecar()}},
		{name: "Block-mode quiver PVC: every disk laid out in its device, and the hook", body: review(KindVMI, "CREATE", vmi("", pvc("rootdisk", "vm1-block"))),
			annPath:  []string{"metadata", "annotations"},
			blocks:   `{"rootdisk":[{"name":"disk","size":1073741824},{"name":"data","size":2147483648},{"name":"logs","size":3221225472}]}`,
			sidecars: []any{ourSidecar()}},
		{name: "unbound Block-mode quiver PVC gets a warning", body: review(KindVMI, "CREATE", vmi("", pvc("rootdisk", "vm1-block-pending"))),
			warning: "Block-mode PVC not bound yet"},
		{name: "stale quiver annotations are removed", body: review(KindVMI, "CREATE", vmi(`,"annotations":{"quiver.io/extra-disks":"{\"rootdisk\":[\"old\"]}","hooks.kubevirt.io/hookSidecars":"[{\"image\":\"q\",\"args\":[\"kubevirt-hook\"]}]"}`,
			pvc("rootdisk", "ceph-root"))),
			annPath: []string{"metadata", "annotations"}},
		{name: "two quiver PVCs with the same disk name", body: review(KindVMI, "CREATE", vmi("", pvc("rootdisk", "vm1-disks"), pvc("other", "vm1-clash"))),
			denied: `disk "data" is in the quiver volumes of both volume rootdisk and volume other`},
		{name: "quiver volume without a disk named disk", body: review(KindVMI, "CREATE", vmi("", pvc("rootdisk", "vm1-noprim"))),
			denied: `has no disk named "disk" (it has root, data)`},
		{name: "disk name longer than a serial", body: review(KindVMI, "CREATE", vmi("", pvc("rootdisk", "vm1-longname"))),
			denied: "longer than 20 bytes"},
		// The sidecar mounts no PVC: a claim may bear a VM volume's name.
		{name: "claim named like a VM volume", body: review(KindVMI, "CREATE", vmi("", pvc("rootdisk", "vm1-disks"), pvc("x", "rootdisk"))),
			annPath: []string{"metadata", "annotations"}, extra: map[string][]string{"rootdisk": {"data", "logs"}, "x": {"swap"}},
			sidecars: []any{ourSidecar()}},
		{name: "quiver API down", body: review(KindVMI, "CREATE", vmi("", pvc("rootdisk", "vm1-broken"))),
			denied: "quiver volume broken: connection refused"},
		{name: "object not a VM", body: review(KindVM, "CREATE", `{"spec":{"template":"nope"}}`), denied: "VirtualMachine vms/vm1"},
		{name: "VM without template", body: review(KindVM, "CREATE", `{"spec":{}}`), denied: "no spec.template"},
		{name: "bad hookSidecars annotation", body: review(KindVMI, "CREATE", vmi(`,"annotations":{"hooks.kubevirt.io/hookSidecars":"{"}`, pvc("rootdisk", "vm1-disks"))),
			denied: "hooks.kubevirt.io/hookSidecars: not a JSON list"},
		{name: "DELETE is allowed untouched", body: review(KindVMI, "DELETE", "null")},
		{name: "a running VMI's UPDATE is allowed untouched", body: review(KindVMI, "UPDATE", vmi("", pvc("rootdisk", "vm1-disks")))},
		{name: "not JSON", body: `{"apiVersion":`, status: http.StatusBadRequest},
		{name: "no request", body: `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, status: http.StatusBadRequest},
		{name: "request without uid", body: `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"operation":"CREATE"}}`, status: http.StatusBadRequest},
	}
	wh := testWebhook()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			wh.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/mutate", strings.NewReader(tc.body)))
			want := tc.status
			if want == 0 {
				want = http.StatusOK
			}
			if rec.Code != want {
				t.Fatalf("status %d, want %d: %s", rec.Code, want, rec.Body)
			}
			if want != http.StatusOK {
				return
			}
			var out admissionv1.AdmissionReview
			if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
				t.Fatal(err)
			}
			resp := out.Response
			if out.APIVersion != "admission.k8s.io/v1" || out.Kind != "AdmissionReview" || resp == nil || resp.UID != "705ab4f5-6393-11e8-b7cc-42010a800002" {
				t.Fatalf("response %s", rec.Body)
			}
			if tc.denied != "" {
				if resp.Allowed || resp.Result == nil || !strings.Contains(resp.Result.Message, tc.denied) || resp.Patch != nil {
					t.Fatalf("want a refusal mentioning %q, got %s", tc.denied, rec.Body)
				}
				wantCode := int32(http.StatusBadRequest) // the user's to fix
				if strings.Contains(tc.name, "API down") {
					wantCode = http.StatusInternalServerError // a lookup that failed
				}
				if resp.Result.Code != wantCode {
					t.Errorf("refusal code %d, want %d", resp.Result.Code, wantCode)
				}
				return
			}
			if !resp.Allowed {
				t.Fatalf("refused: %s", rec.Body)
			}
			if tc.warning != "" && (len(resp.Warnings) != 1 || !strings.Contains(resp.Warnings[0], tc.warning)) {
				t.Errorf("warnings %q, want one with %q", resp.Warnings, tc.warning)
			}
			if tc.warning == "" && len(resp.Warnings) != 0 {
				t.Errorf("unexpected warnings %q", resp.Warnings)
			}
			if tc.annPath == nil {
				if resp.Patch != nil {
					t.Fatalf("unexpected patch %s", resp.Patch)
				}
				return
			}
			if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
				t.Fatalf("patch type %v", resp.PatchType)
			}
			var req admissionv1.AdmissionReview
			if err := json.Unmarshal([]byte(tc.body), &req); err != nil {
				t.Fatal(err)
			}
			patched := applyPatch(t, req.Request.Object.Raw, resp.Patch)
			ann := lookup(t, patched, tc.annPath)
			checkAnnotations(t, ann, tc.extra, tc.sidecars)
			m, _ := ann.(map[string]any)
			if got, _ := m[kubevirt.AnnotationBlockDisks].(string); got != tc.blocks {
				t.Errorf("%s = %q, want %q", kubevirt.AnnotationBlockDisks, got, tc.blocks)
			}
			if got, _ := m[kubevirt.AnnotationEndpointDisks].(string); got != tc.served {
				t.Errorf("%s = %q, want %q", kubevirt.AnnotationEndpointDisks, got, tc.served)
			}
			if tc.served != "" {
				if _, err := kubevirt.ParseEndpointDisks(tc.served); err != nil {
					t.Errorf("the hook would refuse it: %v", err)
				}
			}

			// Admitting the patched object again changes nothing.
			req.Request.Object.Raw = patched
			again, err := json.Marshal(req)
			if err != nil {
				t.Fatal(err)
			}
			rec = httptest.NewRecorder()
			wh.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/mutate", bytes.NewReader(again)))
			var second admissionv1.AdmissionReview
			if err := json.Unmarshal(rec.Body.Bytes(), &second); err != nil || second.Response == nil || second.Response.Patch != nil {
				t.Errorf("second admission: %v: %s", err, rec.Body)
			}
		})
	}
	rec := httptest.NewRecorder()
	wh.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/mutate", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d", rec.Code)
	}
}

func checkAnnotations(t *testing.T, ann any, extra map[string][]string, sidecars []any) {
	t.Helper()
	m, _ := ann.(map[string]any)
	if extra == nil {
		if _, ok := m[kubevirt.AnnotationExtraDisks]; ok {
			t.Errorf("annotation %s left: %v", kubevirt.AnnotationExtraDisks, m)
		}
	} else {
		value, _ := m[kubevirt.AnnotationExtraDisks].(string)
		got, err := kubevirt.ParseExtraDisks(value)
		if err != nil || !reflect.DeepEqual(map[string][]string(got), extra) {
			t.Errorf("%s = %q (%v), want %v", kubevirt.AnnotationExtraDisks, value, err, extra)
		}
	}
	list, _ := m[kubevirt.AnnotationHookSidecars].(string)
	if sidecars == nil {
		if list != "" {
			t.Errorf("hookSidecars %s, want none", list)
		}
		return
	}
	var got []any
	if err := json.Unmarshal([]byte(list), &got); err != nil || !reflect.DeepEqual(got, sidecars) {
		t.Errorf("hookSidecars = %s (%v), want %v", list, err, sidecars)
	}
}

func jsonValue(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func lookup(t *testing.T, doc []byte, path []string) any {
	t.Helper()
	var v any = jsonValue(t, string(doc))
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			t.Fatalf("no %v in %s", path, doc)
		}
		v = m[p]
	}
	return v
}

// applyPatch applies add and replace operations on object members (all the
// webhook emits), checking RFC 6902's rule that replace needs the member.
func applyPatch(t *testing.T, doc, patch []byte) []byte {
	t.Helper()
	var ops []patchOp
	if err := json.Unmarshal(patch, &ops); err != nil {
		t.Fatalf("patch %s: %v", patch, err)
	}
	root := jsonValue(t, string(doc))
	for _, op := range ops {
		parts := strings.Split(strings.TrimPrefix(op.Path, "/"), "/")
		parent := root
		for _, p := range parts[:len(parts)-1] {
			parent = parent.(map[string]any)[p]
		}
		m, ok := parent.(map[string]any)
		if !ok {
			t.Fatalf("op %v: parent missing", op)
		}
		last := parts[len(parts)-1]
		if _, exists := m[last]; op.Op == "replace" && !exists {
			t.Fatalf("op %v: replace of a missing member", op)
		}
		if op.Op != "add" && op.Op != "replace" {
			t.Fatalf("op %v: unexpected", op)
		}
		m[last] = jsonValue(t, mustJSON(t, op.Value))
	}
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(root); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSpace(buf.Bytes())
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func metaKind(kind string) metav1.GroupVersionKind {
	return metav1.GroupVersionKind{Group: "kubevirt.io", Version: "v1", Kind: kind}
}

// TestWebhookUnboundOnCluster: a Filesystem claim not bound yet (a
// DataVolume's, WaitForFirstConsumer) takes its disks from the StorageClass
// and the endpoint-or-files choice from the server: a cluster's node gets
// every disk through the endpoint, as the CSI node plugin will stage it; a
// server whose pool cannot be read refuses the admission (a lookup error)
// rather than guess.
func TestWebhookUnboundOnCluster(t *testing.T) {
	claims := fakeClaims{
		"vms/vm1-pending": {Driver: DefaultDriver, ClassDisks: []string{"disk", "scratch"}},
		"vms/vm1-plain":   {Driver: DefaultDriver},
	}
	admit := func(vols fakeVolumes, claim string) (*admissionv1.AdmissionResponse, map[string]any) {
		t.Helper()
		wh := New(Config{Image: image, Claims: claims, Volumes: vols})
		obj := vmi("", `{"name":"rootdisk","dataVolume":{"name":"`+claim+`"}}`)
		resp := wh.Review(t.Context(), &admissionv1.AdmissionRequest{UID: "u1", Kind: metaKind(KindVMI), Namespace: "vms", Name: "vm1",
			Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: []byte(obj)}})
		if !resp.Allowed || resp.Patch == nil {
			return resp, nil
		}
		ann, _ := lookup(t, applyPatch(t, []byte(obj), resp.Patch), []string{"metadata", "annotations"}).(map[string]any)
		return resp, ann
	}
	for _, tc := range []struct {
		claim, served string
	}{
		{"vm1-pending", `{"rootdisk":["disk","scratch"]}`},
		{"vm1-plain", `{"rootdisk":["disk"]}`},
	} {
		resp, ann := admit(fakeVolumes{onCluster: nil}, tc.claim)
		if got, _ := ann[kubevirt.AnnotationEndpointDisks].(string); got != tc.served || ann[kubevirt.AnnotationExtraDisks] != nil {
			t.Errorf("claim %s on a cluster: annotations %v (response %+v), want %s = %s and no %s",
				tc.claim, ann, resp, kubevirt.AnnotationEndpointDisks, tc.served, kubevirt.AnnotationExtraDisks)
		}
	}
	if _, ann := admit(fakeVolumes{}, "vm1-pending"); ann[kubevirt.AnnotationExtraDisks] != `{"rootdisk":["scratch"]}` || ann[kubevirt.AnnotationEndpointDisks] != nil {
		t.Errorf("on a single node: annotations %v, want the extra disk scratch as a file", ann)
	}
	resp, _ := admit(fakeVolumes{poolDown: nil}, "vm1-pending")
	if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusInternalServerError || !strings.Contains(resp.Result.Message, "is it a cluster?") {
		t.Errorf("pool unreadable: %+v, want a refusal naming the lookup", resp)
	}
}
