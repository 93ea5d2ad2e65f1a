package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
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

var _ Claims = (*Kube)(nil)

// Claim reads the PVC, then its PV when bound, else its StorageClass.
func (k *Kube) Claim(ctx context.Context, namespace, name string) (Claim, error) {
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

// get reads one object of a claim; ErrClaimNotFound when there is none.
func (k *Kube) get(ctx context.Context, path string, out any) error {
	err := k.do(ctx, http.MethodGet, path, "", nil, out)
	if errors.Is(err, errNotFound) {
		return ErrClaimNotFound
	}
	return err
}
