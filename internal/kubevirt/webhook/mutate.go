package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/kubevirt"
)

// Volumes reads quiver volumes; *client.Client is one.
type Volumes interface {
	GetVolume(ctx context.Context, name string) (api.Volume, error)
}

var _ Volumes = (*client.Client)(nil)

// DefaultDriver is the quiver CSI driver's name.
const DefaultDriver = "csi.quiver.io"

// PodDiskDir is where KubeVirt mounts a Filesystem PVC volume in the
// virt-launcher pod: <PodDiskDir>/<volume>/disk.img. The sidecar gets the
// same PVC at the same path, so the hook sees the files it adds.
const PodDiskDir = "/var/run/kubevirt-private/vmi-disks"

// Config configures a Webhook.
type Config struct {
	Claims  Claims
	Volumes Volumes
	// Driver is the CSI driver whose PVCs are quiver volumes.
	Driver string
	// Image is the hook sidecar's image (a quiver image).
	Image string
	// ImagePullPolicy of the sidecar: IfNotPresent when empty.
	ImagePullPolicy string
	Logger          *slog.Logger
}

// Webhook decides the mutation of one object.
type Webhook struct {
	cfg Config
}

// New builds a Webhook.
func New(cfg Config) *Webhook {
	if cfg.Driver == "" {
		cfg.Driver = DefaultDriver
	}
	if cfg.ImagePullPolicy == "" {
		cfg.ImagePullPolicy = "IfNotPresent"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Webhook{cfg: cfg}
}

// Sentinels of admission: a refusal the user must fix, or a failed lookup.
var (
	ErrDenied = errors.New("denied")
	ErrLookup = errors.New("lookup failed")
)

// sidecarCommand is the sidecar's command; entries with it in
// hookSidecars are the webhook's own and are rebuilt on every admission.
const sidecarCommand = "kubevirt-hook"

// sidecar is one entry of hooks.kubevirt.io/hookSidecars (KubeVirt's
// hooks.HookSidecar).
type sidecar struct {
	Image           string      `json:"image"`
	ImagePullPolicy string      `json:"imagePullPolicy"`
	Command         []string    `json:"command,omitempty"`
	Args            []string    `json:"args,omitempty"`
	PVC             *sidecarPVC `json:"pvc,omitempty"`
}

type sidecarPVC struct {
	Name       string `json:"name"`
	VolumePath string `json:"volumePath"`
}

// annotate returns the annotations a VMI with these volumes should carry,
// and warnings for the user. It never changes annotations other than
// quiver's and its own sidecar entries in hookSidecars.
func (w *Webhook) annotate(ctx context.Context, namespace string, annotations map[string]string, volumes []kubevirt.Volume) (map[string]string, []string, error) {
	extra := kubevirt.ExtraDisks{}
	blocks := kubevirt.BlockDisks{}
	var sidecars []sidecar
	var warnings []string
	owner := map[string]string{} // disk name -> volume, for serial clashes
	podVolumes := map[string]bool{}
	for _, v := range volumes {
		podVolumes[v.Name] = true
	}
	for _, v := range volumes {
		claim := v.ClaimName()
		if claim == "" || (v.PersistentVolumeClaim != nil && v.PersistentVolumeClaim.Hotplug) || (v.DataVolume != nil && v.DataVolume.Hotplug) {
			continue
		}
		c, err := w.cfg.Claims.Claim(ctx, namespace, claim)
		if errors.Is(err, ErrClaimNotFound) {
			continue // not there yet (a DataVolume template): the VMI's admission will see it
		}
		if err != nil {
			return nil, nil, fmt.Errorf("volume %s: %v: %w", v.Name, err, ErrLookup)
		}
		if c.Driver != w.cfg.Driver {
			continue
		}
		if c.Block {
			layout, warning, err := w.blockLayout(ctx, c, v.Name, owner)
			if err != nil {
				return nil, nil, fmt.Errorf("volume %s (PVC %s): %w", v.Name, claim, err)
			}
			if warning != "" {
				warnings = append(warnings, warning)
			}
			if layout == nil {
				continue
			}
			// The PVC is one block device holding every disk; the
			// hook gives QEMU each as a slice of it. A Block PVC
			// cannot be mounted in the sidecar: it needs none.
			blocks[v.Name] = layout
			sidecars = append(sidecars, sidecar{
				Image: w.cfg.Image, ImagePullPolicy: w.cfg.ImagePullPolicy,
				Command: []string{"quiver"}, Args: []string{sidecarCommand, "--volume", v.Name},
			})
			continue
		}
		disks, err := w.disks(ctx, c)
		if err != nil {
			return nil, nil, fmt.Errorf("volume %s (PVC %s): %w", v.Name, claim, err)
		}
		if !slices.Contains(disks, kubevirt.PrimaryDisk) {
			return nil, nil, fmt.Errorf("volume %s (PVC %s): the quiver volume has no disk named %q (it has %s); KubeVirt boots disk.img from a Filesystem PVC and would create one: name the primary disk %q (StorageClass disks: %s=...): %w",
				v.Name, claim, kubevirt.PrimaryDisk, strings.Join(disks, ", "), kubevirt.PrimaryDisk, kubevirt.PrimaryDisk, ErrDenied)
		}
		var names []string
		for _, d := range disks {
			if d == kubevirt.PrimaryDisk {
				continue
			}
			if err := kubevirt.CheckDiskName(d); err != nil {
				return nil, nil, fmt.Errorf("volume %s (PVC %s): %v: %w", v.Name, claim, err, ErrDenied)
			}
			if other, dup := owner[d]; dup {
				return nil, nil, fmt.Errorf("disk %q is in the quiver volumes of both volume %s and volume %s; a disk's name is its serial in the guest and must be unique: %w",
					d, other, v.Name, ErrDenied)
			}
			owner[d] = v.Name
			names = append(names, d)
		}
		// Every Filesystem-mode quiver PVC gets the hook, a one-disk volume
		// too: on a compute node whose endpoint serves the volume the PVC
		// holds only the endpoint's socket and an empty placeholder
		// disk.img, and the hook gives QEMU the disk on the socket (it
		// leaves the domain unchanged for a volume not served that way).
		if podVolumes[claim] {
			return nil, nil, fmt.Errorf("volume %s: its PVC %s has the name of a volume of the VM, and the hook sidecar mounts the PVC as a pod volume of that name; rename the VM's volume: %w",
				v.Name, claim, ErrDenied)
		}
		if len(names) > 0 {
			extra[v.Name] = names
		}
		sidecars = append(sidecars, sidecar{
			Image: w.cfg.Image, ImagePullPolicy: w.cfg.ImagePullPolicy,
			Command: []string{"quiver"}, Args: []string{sidecarCommand, "--volume", v.Name},
			PVC: &sidecarPVC{Name: claim, VolumePath: PodDiskDir + "/" + v.Name},
		})
	}

	out := maps.Clone(annotations)
	if out == nil {
		out = map[string]string{}
	}
	if len(extra) > 0 {
		out[kubevirt.AnnotationExtraDisks] = extra.Format()
	} else {
		delete(out, kubevirt.AnnotationExtraDisks)
	}
	if len(blocks) > 0 {
		out[kubevirt.AnnotationBlockDisks] = blocks.Format()
	} else {
		delete(out, kubevirt.AnnotationBlockDisks)
	}
	list, err := mergeSidecars(annotations[kubevirt.AnnotationHookSidecars], sidecars)
	if err != nil {
		return nil, nil, err
	}
	if list == "" {
		delete(out, kubevirt.AnnotationHookSidecars)
	} else {
		out[kubevirt.AnnotationHookSidecars] = list
	}
	return out, warnings, nil
}

// disks lists the quiver volume's disk names in order: from the volume when
// the claim is bound, else from the StorageClass (one disk "disk" when it
// names none).
func (w *Webhook) disks(ctx context.Context, c Claim) ([]string, error) {
	if c.Volume == "" {
		if c.ClassDisks == nil {
			return []string{kubevirt.PrimaryDisk}, nil
		}
		return c.ClassDisks, nil
	}
	v, err := w.cfg.Volumes.GetVolume(ctx, c.Volume)
	if err != nil {
		return nil, fmt.Errorf("quiver volume %s: %v: %w", c.Volume, err, ErrLookup)
	}
	names := make([]string, 0, len(v.Disks))
	for _, d := range v.Disks {
		names = append(names, d.Name)
	}
	return names, nil
}

// blockLayout lays out a Block-mode quiver PVC's disks in its one device:
// the volume's disks in its order, slot i for disk i (the compute node's
// endpoint serves them so). An unbound claim has no sizes yet: it gets a
// warning and no layout (the VMI's admission, once bound, lays it out).
// Disk names are serials: unique across the VMI (owner).
func (w *Webhook) blockLayout(ctx context.Context, c Claim, volume string, owner map[string]string) ([]kubevirt.BlockDisk, string, error) {
	if c.Volume == "" {
		return nil, fmt.Sprintf("quiver: volume %s is a Block-mode PVC not bound yet: its disks are laid out when the VMI is admitted", volume), nil
	}
	v, err := w.cfg.Volumes.GetVolume(ctx, c.Volume)
	if err != nil {
		return nil, "", fmt.Errorf("quiver volume %s: %v: %w", c.Volume, err, ErrLookup)
	}
	if len(v.Disks) == 0 {
		return nil, "", fmt.Errorf("quiver volume %s has no disk: %w", c.Volume, ErrDenied)
	}
	var layout []kubevirt.BlockDisk
	for _, d := range v.Disks {
		if d.Name != kubevirt.PrimaryDisk {
			if err := kubevirt.CheckDiskName(d.Name); err != nil {
				return nil, "", fmt.Errorf("%v: %w", err, ErrDenied)
			}
		}
		if other, dup := owner[d.Name]; dup && d.Name != kubevirt.PrimaryDisk {
			return nil, "", fmt.Errorf("disk %q is in the quiver volumes of both volume %s and volume %s; a disk's name is its serial in the guest and must be unique: %w",
				d.Name, other, volume, ErrDenied)
		}
		owner[d.Name] = volume
		layout = append(layout, kubevirt.BlockDisk{Name: d.Name, Size: d.Size})
	}
	return layout, "", nil
}

// mergeSidecars replaces the webhook's own entries of a hookSidecars list
// with ours, keeping every other entry as it was (unknown fields
// included); "" when the list ends up empty.
func mergeSidecars(existing string, ours []sidecar) (string, error) {
	var list []json.RawMessage
	if existing != "" {
		if err := json.Unmarshal([]byte(existing), &list); err != nil {
			return "", fmt.Errorf("annotation %s: not a JSON list of sidecars: %v: %w", kubevirt.AnnotationHookSidecars, err, ErrDenied)
		}
	}
	var kept []json.RawMessage
	for _, raw := range list {
		var s sidecar
		if err := json.Unmarshal(raw, &s); err == nil && len(s.Args) > 0 && s.Args[0] == sidecarCommand {
			continue
		}
		kept = append(kept, raw)
	}
	if len(kept) == len(list) && len(ours) == 0 {
		return existing, nil // nothing of ours, before or after: leave it as written
	}
	for _, s := range ours {
		b, err := json.Marshal(s)
		if err != nil {
			return "", err
		}
		kept = append(kept, b)
	}
	if len(kept) == 0 {
		return "", nil
	}
	b, err := json.Marshal(kept)
	return string(b), err
}
