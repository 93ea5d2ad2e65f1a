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

// Volumes reads quiver volumes and the pool's answer (whether the server
// is a cluster); *client.Client is one.
type Volumes interface {
	GetVolume(ctx context.Context, name string) (api.Volume, error)
	Pool(ctx context.Context) (api.PoolInfo, error)
}

var _ Volumes = (*client.Client)(nil)

// DefaultDriver is the quiver CSI driver's name.
const DefaultDriver = "csi.quiver.io"

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
// hooks.HookSidecar). It never asks KubeVirt for a PVC (the entry's "pvc"):
// the launcher pod would name the VM's claim twice, and the kubelet mounts
// a claim once per pod and waits for ever for the second. The hook needs no
// file of the PVC: the annotations say everything.
type sidecar struct {
	Image           string   `json:"image"`
	ImagePullPolicy string   `json:"imagePullPolicy"`
	Command         []string `json:"command,omitempty"`
	Args            []string `json:"args,omitempty"`
}

// annotate returns the annotations a VMI with these volumes should carry,
// and warnings for the user. It never changes annotations other than
// quiver's and its own sidecar entry in hookSidecars.
func (w *Webhook) annotate(ctx context.Context, namespace string, annotations map[string]string, volumes []kubevirt.Volume) (map[string]string, []string, error) {
	extra := kubevirt.ExtraDisks{}
	blocks := kubevirt.BlockDisks{}
	served := kubevirt.EndpointDisks{}
	var warnings []string
	owner := map[string]string{} // disk name -> volume, for serial clashes
	var cluster *bool            // whether the server is a cluster, asked once
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
			if layout != nil {
				// The PVC is one block device holding every disk;
				// the hook gives QEMU each as a slice of it.
				blocks[v.Name] = layout
			}
			continue
		}
		disks, onCluster, err := w.disks(ctx, c, &cluster)
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
		switch {
		case onCluster:
			// The CSI node plugin stages a cluster's volume at the
			// compute node's endpoint: the PVC holds its socket and
			// an empty placeholder disk.img, and the hook gives QEMU
			// every disk, a one-disk volume's too, on the socket.
			served[v.Name] = disks
		case len(names) > 0:
			extra[v.Name] = names
		}
	}

	out := maps.Clone(annotations)
	if out == nil {
		out = map[string]string{}
	}
	set := func(key string, n int, value func() string) {
		if n > 0 {
			out[key] = value()
		} else {
			delete(out, key)
		}
	}
	set(kubevirt.AnnotationExtraDisks, len(extra), extra.Format)
	set(kubevirt.AnnotationBlockDisks, len(blocks), blocks.Format)
	set(kubevirt.AnnotationEndpointDisks, len(served), served.Format)
	// One sidecar serves every volume the annotations name.
	var sidecars []sidecar
	if len(extra)+len(blocks)+len(served) > 0 {
		sidecars = append(sidecars, sidecar{Image: w.cfg.Image, ImagePullPolicy: w.cfg.ImagePullPolicy,
			Command: []string{"quiver"}, Args: []string{sidecarCommand}})
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

// disks lists the quiver volume's disk names in order, and whether the
// cluster keeps it: from the volume when the claim is bound, else from the
// StorageClass (one disk "disk" when it names none) and the server (a
// cluster's volumes are all kept by its nodes). cluster caches the
// server's answer for one admission.
func (w *Webhook) disks(ctx context.Context, c Claim, cluster **bool) ([]string, bool, error) {
	if c.Volume == "" {
		if *cluster == nil {
			p, err := w.cfg.Volumes.Pool(ctx)
			if err != nil {
				return nil, false, fmt.Errorf("the quiver server (is it a cluster?): %v: %w", err, ErrLookup)
			}
			is := p.Cluster != ""
			*cluster = &is
		}
		if c.ClassDisks == nil {
			return []string{kubevirt.PrimaryDisk}, **cluster, nil
		}
		return c.ClassDisks, **cluster, nil
	}
	v, err := w.cfg.Volumes.GetVolume(ctx, c.Volume)
	if err != nil {
		return nil, false, fmt.Errorf("quiver volume %s: %v: %w", c.Volume, err, ErrLookup)
	}
	names := make([]string, 0, len(v.Disks))
	for _, d := range v.Disks {
		names = append(names, d.Name)
	}
	// As the CSI node plugin decides (internal/csi, onCluster).
	return names, v.Primary != "" || len(v.Copies) > 0, nil
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
