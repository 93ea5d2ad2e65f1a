package auth

import (
	"fmt"

	"github.com/quiverstorage/quiver/internal/qos"
)

// Unlimited is the IOPS of a volume without an IOPS limit, in a Quota of
// use: it exceeds any IOPS quota.
const Unlimited = -1

// IOPS is what a volume's QoS counts against an IOPS quota: its rw_iops, or
// read_iops + write_iops when both are set, else Unlimited.
func IOPS(l qos.Limits) int64 {
	switch {
	case l.RWIOPS > 0:
		return l.RWIOPS
	case l.ReadIOPS > 0 && l.WriteIOPS > 0:
		return l.ReadIOPS + l.WriteIOPS
	}
	return Unlimited
}

// Add returns u plus v, Unlimited IOPS staying Unlimited.
func (u Quota) Add(v Quota) Quota {
	out := Quota{Volumes: u.Volumes + v.Volumes, Capacity: u.Capacity + v.Capacity, Snapshots: u.Snapshots + v.Snapshots}
	if u.IOPS == Unlimited || v.IOPS == Unlimited {
		out.IOPS = Unlimited
	} else {
		out.IOPS = u.IOPS + v.IOPS
	}
	return out
}

// Admit checks that a tenant using used may take add more under quota q,
// and returns an error matching ErrQuota that names the quota otherwise.
// Only what add grows is checked: a tenant over a quota lowered after the
// fact may still shrink.
func (q Quota) Admit(tenant string, used, add Quota) error {
	for _, c := range []struct {
		name            string
		limit, use, add int64
		unit            string
	}{
		{"volumes", q.Volumes, used.Volumes, add.Volumes, ""},
		{"capacity", q.Capacity, used.Capacity, add.Capacity, " bytes"},
		{"snapshots", q.Snapshots, used.Snapshots, add.Snapshots, ""},
	} {
		if c.limit > 0 && c.add > 0 && c.use+c.add > c.limit {
			return fmt.Errorf("tenant %q: quota %s is %d%s, %d in use, %d more asked: %w",
				tenant, c.name, c.limit, c.unit, c.use, c.add, ErrQuota)
		}
	}
	if q.IOPS > 0 && add.IOPS != 0 {
		switch {
		case add.IOPS == Unlimited:
			return fmt.Errorf("tenant %q: quota iops is %d, and a volume without an IOPS limit (qos rw_iops) would exceed it: %w",
				tenant, q.IOPS, ErrQuota)
		case add.IOPS > 0 && (used.IOPS == Unlimited || used.IOPS+add.IOPS > q.IOPS):
			use := fmt.Sprint(used.IOPS)
			if used.IOPS == Unlimited {
				use = "unlimited"
			}
			return fmt.Errorf("tenant %q: quota iops is %d, %s in use, %d more asked: %w", tenant, q.IOPS, use, add.IOPS, ErrQuota)
		}
	}
	return nil
}
