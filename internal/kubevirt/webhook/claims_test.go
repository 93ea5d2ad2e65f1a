package webhook

import (
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

// TestKubeClaims reads claims from a fake Kubernetes API over TLS, with a
// kubeconfig (its CA and token, through client-go's HTTP client): bound
// (the PV's CSI driver and handle), unbound (the StorageClass's provisioner
// and disks), Block mode, missing, an API error, and a request without the
// token.
func TestKubeClaims(t *testing.T) {
	objects := map[string]string{
		"/api/v1/namespaces/vms/persistentvolumeclaims/bound": `{"spec":{"volumeName":"pv-1","volumeMode":"Filesystem"}}`,
		"/api/v1/persistentvolumes/pv-1":                      `{"spec":{"csi":{"driver":"csi.quiver.io","volumeHandle":"pvc-1"}}}`,
		"/api/v1/namespaces/vms/persistentvolumeclaims/block": `{"spec":{"volumeName":"pv-1","volumeMode":"Block"}}`,
		"/api/v1/namespaces/vms/persistentvolumeclaims/wait":  `{"spec":{"storageClassName":"quiver-vm"}}`,
		"/apis/storage.k8s.io/v1/storageclasses/quiver-vm":    `{"provisioner":"csi.quiver.io","parameters":{"disks":"disk=20Gi, data=1Ti"}}`,
		"/api/v1/namespaces/vms/persistentvolumeclaims/nfs":   `{"spec":{"volumeName":"pv-nfs"}}`,
		"/api/v1/persistentvolumes/pv-nfs":                    `{"spec":{"nfs":{"server":"x","path":"/"}}}`,
	}
	api := newFakeAPI(t, "sa-token", objects)
	api.status["/api/v1/namespaces/vms/persistentvolumeclaims/error"] = http.StatusInternalServerError
	k, err := NewKube(api.kubeconfig(t))
	if err != nil {
		t.Fatal(err)
	}
	wrong := &Kube{Server: api.URL, HTTP: api.Client()} // no token
	cases := map[string]struct {
		want Claim
		err  error
	}{
		"bound":   {want: Claim{Driver: DefaultDriver, Volume: "pvc-1"}},
		"block":   {want: Claim{Driver: DefaultDriver, Volume: "pvc-1", Block: true}},
		"wait":    {want: Claim{Driver: DefaultDriver, ClassDisks: []string{"disk", "data"}}},
		"nfs":     {want: Claim{}},
		"missing": {err: ErrClaimNotFound},
	}
	for name, tc := range cases {
		got, err := k.Claim(t.Context(), "vms", name)
		if !errors.Is(err, tc.err) || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %+v, %v; want %+v, %v", name, got, err, tc.want, tc.err)
		}
	}
	if _, err := k.Claim(t.Context(), "vms", "error"); err == nil || errors.Is(err, ErrClaimNotFound) {
		t.Errorf("API error: %v", err)
	}
	if _, err := wrong.Claim(t.Context(), "vms", "bound"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("without the token: %v, want a 401 error", err)
	}
}
