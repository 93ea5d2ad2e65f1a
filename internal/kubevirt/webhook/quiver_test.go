package webhook

import (
	"encoding/json"
	"os"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/kubevirt"
	"github.com/quiverstorage/quiver/internal/testserver"
)

func TestMain(m *testing.M) { os.Exit(testserver.Main(m)) }

// TestWebhookWithQuiverAPI reads the disks from a real quiver server
// through internal/client: a volume made with disks disk, data, logs gives
// the VMI those two extra disks, in the volume's order; a disk added to the
// volume later shows up at the next admission (the VM's next start).
func TestWebhookWithQuiverAPI(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	srv := testserver.StartT(t, testserver.Binary(t, true), testserver.Options{})
	ctx := t.Context()
	spec := api.VolumeSpec{Name: "pvc-0a1b", Capacity: 1 << 30, Disks: []api.DiskSpec{
		{Name: "disk", Size: 64 << 20}, {Name: "logs", Size: 64 << 20}, {Name: "data", Size: 64 << 20},
	}}
	if _, err := srv.API.CreateVolume(ctx, spec); err != nil {
		t.Fatal(err)
	}
	wh := New(Config{Image: image, Volumes: srv.API,
		Claims: fakeClaims{"vms/vm1-disks": {Driver: DefaultDriver, Volume: "pvc-0a1b"}}})
	admit := func() kubevirt.ExtraDisks {
		t.Helper()
		req := &admissionv1.AdmissionRequest{UID: "u1", Kind: metaKind(KindVMI), Namespace: "vms", Name: "vm1",
			Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: []byte(vmi("", pvc("rootdisk", "vm1-disks")))}}
		resp := wh.Review(ctx, req)
		if !resp.Allowed || resp.Patch == nil {
			t.Fatalf("response %+v", resp)
		}
		var ops []patchOp
		if err := json.Unmarshal(resp.Patch, &ops); err != nil || len(ops) != 1 {
			t.Fatalf("patch %s: %v", resp.Patch, err)
		}
		ann, _ := ops[0].Value.(map[string]any)
		value, _ := ann[kubevirt.AnnotationExtraDisks].(string)
		extra, err := kubevirt.ParseExtraDisks(value)
		if err != nil {
			t.Fatal(err)
		}
		return extra
	}
	if got := admit().Format(); got != `{"rootdisk":["logs","data"]}` {
		t.Fatalf("extra disks %s, want logs, data in the volume's order", got)
	}
	if _, err := srv.API.AddDisk(ctx, "pvc-0a1b", api.DiskSpec{Name: "scratch", Size: 64 << 20}); err != nil {
		t.Fatal(err)
	}
	if got := admit().Format(); got != `{"rootdisk":["logs","data","scratch"]}` {
		t.Fatalf("after disk add: extra disks %s", got)
	}
}
