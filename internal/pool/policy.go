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
	unlock, err := v.lockOps("set backup policy")
	if err != nil {
		return VolumeInfo{}, err
	}
	defer unlock()
	m := v.manifest()
	m.BackupPolicy = p
	if err := v.commit(m); err != nil {
		return VolumeInfo{}, err
	}
	return v.Info(), nil
}
