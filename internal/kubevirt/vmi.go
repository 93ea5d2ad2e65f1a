package kubevirt

import (
	"encoding/json"
	"fmt"
)

// VMI is the subset of KubeVirt's VirtualMachineInstance (kubevirt.io/api
// core/v1) the hook reads; field names follow upstream.
type VMI struct {
	Metadata ObjectMeta `json:"metadata"`
	Spec     VMISpec    `json:"spec"`
}

// ObjectMeta is the subset of metav1.ObjectMeta used here.
type ObjectMeta struct {
	Name        string            `json:"name,omitempty"`
	Namespace   string            `json:"namespace,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// VMISpec is the subset of VirtualMachineInstanceSpec used here.
type VMISpec struct {
	Volumes []Volume `json:"volumes,omitempty"`
}

// Volume is a VMI volume; only the PVC-backed sources matter to quiver.
type Volume struct {
	Name                  string         `json:"name"`
	PersistentVolumeClaim *ClaimSource   `json:"persistentVolumeClaim,omitempty"`
	DataVolume            *DataVolumeRef `json:"dataVolume,omitempty"`
	// HostDisk is what virt-launcher makes of a Filesystem-mode PVC or
	// DataVolume before it calls the hooks (KubeVirt's
	// ReplacePVCByHostDisk): the disk.img in the PVC's directory.
	HostDisk *HostDiskSource `json:"hostDisk,omitempty"`
}

// HostDiskSource is the part of KubeVirt's HostDisk the hook reads.
type HostDiskSource struct {
	Path string `json:"path"`
}

// ClaimSource is KubeVirt's PersistentVolumeClaimVolumeSource (it inlines
// the core one).
type ClaimSource struct {
	ClaimName string `json:"claimName"`
	ReadOnly  bool   `json:"readOnly,omitempty"`
	Hotplug   bool   `json:"hotpluggable,omitempty"`
}

// DataVolumeRef is KubeVirt's DataVolumeSource: the PVC has the
// DataVolume's name.
type DataVolumeRef struct {
	Name    string `json:"name"`
	Hotplug bool   `json:"hotpluggable,omitempty"`
}

// FromClaim says whether a volume is a PVC's as the hook sees it: a PVC or
// DataVolume volume, or the hostDisk virt-launcher turned a Filesystem
// PVC into before the call.
func (v Volume) FromClaim() bool {
	return v.ClaimName() != "" || (v.HostDisk != nil && v.HostDisk.Path != "")
}

// ClaimName is the PVC behind a volume, "" when it has none.
func (v Volume) ClaimName() string {
	switch {
	case v.PersistentVolumeClaim != nil:
		return v.PersistentVolumeClaim.ClaimName
	case v.DataVolume != nil:
		return v.DataVolume.Name
	}
	return ""
}

// DecodeVMI decodes a VMI's JSON, as virt-launcher sends it to hooks.
func DecodeVMI(b []byte) (VMI, error) {
	var vmi VMI
	if err := json.Unmarshal(b, &vmi); err != nil {
		return vmi, fmt.Errorf("VMI JSON: %v: %w", err, ErrInvalid)
	}
	return vmi, nil
}
