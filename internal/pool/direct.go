package pool

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Direct access: a holder (a node's CSI plugin) hands a VM the image files
// themselves (a single node's Filesystem-mode volume), so the VM's writes
// never pass through quiver and change tracking cannot see them. While any
// holder is recorded, every disk counts as changed whole: the live maps'
// all flag is set ahead when the first holder comes, and every checkpoint
// starts its new epoch all changed. The epoch in which the last holder
// goes stays all changed; the next one is tracked again.

// SetDirectAccess records (on) or forgets (off) a holder of the volume's
// image files. Durable on return: a caller hands the files out only after
// it returned.
func (v *Volume) SetDirectAccess(ctx context.Context, holder string, on bool) (VolumeInfo, error) {
	if errs := validation.IsDNS1123Subdomain(holder); len(errs) > 0 {
		return VolumeInfo{}, invalid("holder", holder, "must be a DNS subdomain (a node name)")
	}
	unlock, err := v.lockOps("direct access")
	if err != nil {
		return VolumeInfo{}, err
	}
	defer unlock()
	m := v.manifest()
	if on && m.Key != nil {
		return VolumeInfo{}, fmt.Errorf("direct access to volume %q: it is encrypted, and its image files hold ciphertext that only quiver's data path (NBD) decrypts; attach it as a block device: %w",
			v.name, ErrEncrypted)
	}
	has := slices.Contains(m.DirectAccess, holder)
	if has == on {
		return v.Info(), nil
	}
	if on {
		if err := v.markAllChanged(m.Disks); err != nil {
			return VolumeInfo{}, err
		}
		m.DirectAccess = append(slices.Clone(m.DirectAccess), holder)
		slices.Sort(m.DirectAccess)
	} else {
		m.DirectAccess = slices.DeleteFunc(slices.Clone(m.DirectAccess), func(h string) bool { return h == holder })
		if len(m.DirectAccess) == 0 {
			m.DirectAccess = nil
		}
	}
	if err := v.commit(m); err != nil {
		return VolumeInfo{}, err
	}
	return v.Info(), nil
}

// direct reports whether a holder has the image files (gate or not).
func (v *Volume) direct() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.m.DirectAccess) > 0
}
