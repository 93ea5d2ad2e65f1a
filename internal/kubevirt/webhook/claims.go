package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
)

// Claim is what the webhook needs to know of a PVC.
type Claim struct {
	// Driver is the CSI driver of the bound PV, or the provisioner of the
	// StorageClass while the claim is unbound.
	Driver string
	// Volume is the PV's volume handle (the quiver volume name); "" while
	// unbound.
	Volume string
	// Block: volumeMode Block.
	Block bool
	// ClassDisks are the disk names of the StorageClass's disks parameter,
	// used while the claim is unbound; nil when it names none.
	ClassDisks []string
}

// Claims looks up PVCs. ErrClaimNotFound when there is none.
type Claims interface {
	Claim(ctx context.Context, namespace, name string) (Claim, error)
}

// ErrClaimNotFound: the PVC does not exist (yet).
var ErrClaimNotFound = errors.New("claim not found")

// KubeClaims reads PVCs, PVs and StorageClasses from the Kubernetes API with
// plain HTTP requests (client-go is not a dependency of quiver).
type KubeClaims struct {
	// Server is the API server's URL, e.g. https://kubernetes.default.svc.
	Server string
	// Token is the bearer token (the service account's).
	Token string
	// HTTP is the client; its TLS config trusts the cluster's CA.
	HTTP *http.Client
}

var _ Claims = (*KubeClaims)(nil)

// Where a pod finds its service account.
const (
	serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"
	inClusterServer   = "https://kubernetes.default.svc"
)

// InClusterClaims builds KubeClaims from the pod's service account.
func InClusterClaims() (*KubeClaims, error) {
	token, err := os.ReadFile(serviceAccountDir + "/token")
	if err != nil {
		return nil, fmt.Errorf("service account token: %w", err)
	}
	ca, err := os.ReadFile(serviceAccountDir + "/ca.crt")
	if err != nil {
		return nil, fmt.Errorf("service account CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("service account CA: no certificate in %s/ca.crt", serviceAccountDir)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	return &KubeClaims{Server: inClusterServer, Token: strings.TrimSpace(string(token)), HTTP: &http.Client{Transport: tr}}, nil
}

// Claim reads the PVC, then its PV when bound, else its StorageClass.
func (k *KubeClaims) Claim(ctx context.Context, namespace, name string) (Claim, error) {
	var pvc corev1.PersistentVolumeClaim
	if err := k.get(ctx, "/api/v1/namespaces/"+url.PathEscape(namespace)+"/persistentvolumeclaims/"+url.PathEscape(name), &pvc); err != nil {
		return Claim{}, fmt.Errorf("PVC %s/%s: %w", namespace, name, err)
	}
	c := Claim{Block: pvc.Spec.VolumeMode != nil && *pvc.Spec.VolumeMode == corev1.PersistentVolumeBlock}
	if pvc.Spec.VolumeName != "" {
		var pv corev1.PersistentVolume
		if err := k.get(ctx, "/api/v1/persistentvolumes/"+url.PathEscape(pvc.Spec.VolumeName), &pv); err != nil {
			return Claim{}, fmt.Errorf("PV %s of PVC %s/%s: %w", pvc.Spec.VolumeName, namespace, name, err)
		}
		if pv.Spec.CSI != nil {
			c.Driver, c.Volume = pv.Spec.CSI.Driver, pv.Spec.CSI.VolumeHandle
		}
		return c, nil
	}
	if pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName == "" {
		return c, nil
	}
	var sc storagev1.StorageClass
	if err := k.get(ctx, "/apis/storage.k8s.io/v1/storageclasses/"+url.PathEscape(*pvc.Spec.StorageClassName), &sc); err != nil {
		if errors.Is(err, ErrClaimNotFound) {
			return c, nil
		}
		return Claim{}, fmt.Errorf("StorageClass %s of PVC %s/%s: %w", *pvc.Spec.StorageClassName, namespace, name, err)
	}
	c.Driver = sc.Provisioner
	c.ClassDisks = diskNames(sc.Parameters["disks"])
	return c, nil
}

// diskNames takes the names of a disks parameter, "root=40Gi,data=1Ti".
func diskNames(param string) []string {
	if param == "" {
		return nil
	}
	var names []string
	for item := range strings.SplitSeq(param, ",") {
		name, _, _ := strings.Cut(strings.TrimSpace(item), "=")
		names = append(names, name)
	}
	return names
}

func (k *KubeClaims) get(ctx context.Context, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(k.Server, "/")+path, nil)
	if err != nil {
		return err
	}
	if k.Token != "" {
		req.Header.Set("Authorization", "Bearer "+k.Token)
	}
	req.Header.Set("Accept", "application/json")
	hc := k.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return err
	}
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return ErrClaimNotFound
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("kubernetes API %s: %s: %s", path, resp.Status, strings.TrimSpace(string(body)))
	}
	return json.Unmarshal(body, out)
}
