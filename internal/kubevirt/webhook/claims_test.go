package webhook

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
)

// TestKubeClaims reads claims from a fake Kubernetes API: bound (the PV's
// CSI driver and handle), unbound (the StorageClass's provisioner and
// disks), Block mode, missing, and an API error.
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
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer sa-token" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		if r.URL.Path == "/api/v1/namespaces/vms/persistentvolumeclaims/error" {
			http.Error(w, "etcd down", http.StatusInternalServerError)
			return
		}
		body, ok := objects[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(body))
	}))
	defer api.Close()
	k := &KubeClaims{Server: api.URL, Token: "sa-token"}
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
}
