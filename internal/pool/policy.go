package pool

import (
	"context"
	"time"
)

// BackupPolicy is a volume's backup schedule and retention: the pool keeps
// it in the volume's manifest, with the VM; the backup service
// (internal/backup) runs it.
type BackupPolicy struct {
	// Every is how often the volume is backed up (at least a minute).
	Every time.Duration `json:"every"`
	// Target names the backup target ("" for the server's only one).
	Target string `json:"target,omitempty"`
	// Keep: the newest N backups, and the newest of each of the last N
	// days, ISO weeks and months; all zero keeps every backup.
	KeepLast    int `json:"keepLast,omitempty"`
	KeepDaily   int `json:"keepDaily,omitempty"`
	KeepWeekly  int `json:"keepWeekly,omitempty"`
	KeepMonthly int `json:"keepMonthly,omitempty"`
}

// Backup schedules: at least a minute apart, at most a year.
const (
	MinBackupEvery = time.Minute
	MaxBackupEvery = 366 * 24 * time.Hour
)

// ValidateBackupPolicy checks a policy from a caller.
func ValidateBackupPolicy(p BackupPolicy) error {
	if p.Every < MinBackupEvery || p.Every > MaxBackupEvery {
		return invalid("every", p.Every.String(), "must be between 1m and 8784h")
	}
	if p.Target != "" {
		if err := ValidateName("target", p.Target); err != nil {
			return err
		}
	}
	for _, k := range []struct {
		f string
		n int
	}{{"keepLast", p.KeepLast}, {"keepDaily", p.KeepDaily}, {"keepWeekly", p.KeepWeekly}, {"keepMonthly", p.KeepMonthly}} {
		if k.n < 0 || k.n > 10000 {
			return invalid(k.f, "", "must be between 0 and 10000")
		}
	}
	return nil
}

// SetBackupPolicy sets the volume's backup policy, or removes it (nil).
// Durable on return.
func (v *Volume) SetBackupPolicy(ctx context.Context, p *BackupPolicy) (VolumeInfo, error) {
	if p != nil {
		if err := ValidateBackupPolicy(*p); err != nil {
			return VolumeInfo{}, err
		}
		cp := *p
		p = &cp
	}
	return v.setPolicy("set backup policy", func(m *volumeManifest) { m.BackupPolicy = p })
}

// setPolicy changes a policy of the volume's manifest (set), under the
// control lock; durable on return.
func (v *Volume) setPolicy(op string, set func(m *volumeManifest)) (VolumeInfo, error) {
	unlock, err := v.lockOps(op)
	if err != nil {
		return VolumeInfo{}, err
	}
	defer unlock()
	m := v.manifest()
	set(&m)
	if err := v.commit(m); err != nil {
		return VolumeInfo{}, err
	}
	return v.Info(), nil
}

// DRPolicy is a volume's disaster-recovery relationship: its points are
// shipped to the target of Relationship on Site, often enough to keep the
// target's last point at most RPO old. The pool keeps it in the volume's
// manifest, with the VM; the DR scheduler (internal/dr) runs it.
type DRPolicy struct {
	Site         string        `json:"site"`
	Relationship string        `json:"relationship"`
	RPO          time.Duration `json:"rpo"`
}

// Recovery point objectives: from 10 s to a day.
const (
	MinDRRPO = 10 * time.Second
	MaxDRRPO = 24 * time.Hour
)

// ValidateDRPolicy checks a policy from a caller. The relationship's name
// is a name (its points' snapshot names are checked by internal/dr).
func ValidateDRPolicy(p DRPolicy) error {
	if err := ValidateName("site", p.Site); err != nil {
		return err
	}
	if err := ValidateName("relationship", p.Relationship); err != nil {
		return err
	}
	if p.RPO < MinDRRPO || p.RPO > MaxDRRPO {
		return invalid("rpo", p.RPO.String(), "must be between 10s and 24h")
	}
	return nil
}

// SetDRPolicy sets the volume's DR relationship, or removes it (nil).
// Durable on return.
func (v *Volume) SetDRPolicy(ctx context.Context, p *DRPolicy) (VolumeInfo, error) {
	if p != nil {
		if err := ValidateDRPolicy(*p); err != nil {
			return VolumeInfo{}, err
		}
		cp := *p
		p = &cp
	}
	return v.setPolicy("set DR policy", func(m *volumeManifest) { m.DRPolicy = p })
}

// DRPolicies returns the DR policies of the pool's volumes, by volume
// name, from their manifests in memory (no disk is looked at: the DR
// scheduler asks every second).
func (p *Pool) DRPolicies() map[string]DRPolicy {
	p.mu.Lock()
	vols := make([]*Volume, 0, len(p.volumes))
	for _, v := range p.volumes {
		vols = append(vols, v)
	}
	p.mu.Unlock()
	out := map[string]DRPolicy{}
	for _, v := range vols {
		if v.broken == nil {
			if dp := v.manifest().DRPolicy; dp != nil {
				out[v.name] = *dp
			}
		}
	}
	return out
}
