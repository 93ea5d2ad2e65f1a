package cluster

import (
	"context"
	"encoding/json"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Usage is what a tenant's placed volumes count against its quotas, kept in
// etcd under "tenants/<tenant>/use" (docs/security.md, "Tenants on a
// cluster"). It changes only in the Txn that writes or removes a volume
// record, so it is the sum of the Charge of every record of the tenant.
type Usage struct {
	Volumes  int64 `json:"volumes"`
	Capacity int64 `json:"capacity"`
	// IOPS is the sum of the IOPS limits of the volumes that have one;
	// NoIOPSLimit counts those without (any of them exceeds an IOPS
	// quota).
	IOPS        int64 `json:"iops"`
	NoIOPSLimit int64 `json:"noIOPSLimit,omitempty"`
	// Snapshots counts the snapshots of the tenant's volumes taken since
	// they are counted (ChargeSnapshots).
	Snapshots int64 `json:"snapshots,omitempty"`
}

func (u Usage) plus(v Usage) Usage {
	return Usage{Volumes: u.Volumes + v.Volumes, Capacity: u.Capacity + v.Capacity, IOPS: u.IOPS + v.IOPS,
		NoIOPSLimit: u.NoIOPSLimit + v.NoIOPSLimit, Snapshots: u.Snapshots + v.Snapshots}
}

func (u Usage) minus(v Usage) Usage {
	return Usage{Volumes: u.Volumes - v.Volumes, Capacity: u.Capacity - v.Capacity, IOPS: u.IOPS - v.IOPS,
		NoIOPSLimit: u.NoIOPSLimit - v.NoIOPSLimit, Snapshots: u.Snapshots - v.Snapshots}
}

// Charge is what creating a volume of a tenant (spec.Tenant) adds to the
// tenant's Usage, and the quota check: Admit is called with the tenant's
// usage before the volume (nil: no quota) and refuses with an error that
// names the quota. The Txn that records the volume writes the usage only
// if it is still the one Admit saw.
type Charge struct {
	Add   Usage
	Admit func(used Usage) error
}

func (vs Volumes) usageKey(tenant string) string { return vs.n.key("tenants", tenant, "use") }

// TenantUsage returns what tenant's placed volumes count.
func (vs Volumes) TenantUsage(ctx context.Context, tenant string) (Usage, error) {
	u, _, err := vs.readUsage(ctx, tenant)
	return u, err
}

// readUsage returns tenant's usage and its key's mod revision (0: none).
func (vs Volumes) readUsage(ctx context.Context, tenant string) (Usage, int64, error) {
	k := vs.usageKey(tenant)
	resp, err := vs.n.cli.Get(ctx, k)
	if err != nil {
		return Usage{}, 0, fmt.Errorf("read %s: %w", k, err)
	}
	var u Usage
	if len(resp.Kvs) == 0 {
		return u, 0, nil
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &u); err != nil {
		return Usage{}, 0, fmt.Errorf("etcd key %s: %w", k, err)
	}
	return u, resp.Kvs[0].ModRevision, nil
}

// usageUnchanged compares the usage key with the revision it was read at.
func (vs Volumes) usageUnchanged(tenant string, rev int64) clientv3.Cmp {
	k := vs.usageKey(tenant)
	if rev == 0 {
		return clientv3.Compare(clientv3.CreateRevision(k), "=", 0)
	}
	return clientv3.Compare(clientv3.ModRevision(k), "=", rev)
}
