package apiserver

import (
	"sync"

	"github.com/quiverstorage/quiver/internal/auth"
)

// quotas admits the changes that grow a tenant. Each admitted change holds
// a reservation until it is done (made or failed), so that concurrent
// changes are counted together and cannot overshoot a quota; a change that
// is done and not yet released counts twice for a moment, which can only
// refuse, never overshoot.
type quotas struct {
	mu      sync.Mutex
	pending map[string]auth.Quota
}

// usage is what tenant's volumes hold now.
func (s *Server) usage(tenant string) auth.Quota {
	var u auth.Quota
	for _, v := range s.pool.List(nil) {
		if v.Tenant != tenant {
			continue
		}
		u = u.Add(auth.Quota{Volumes: 1, Capacity: v.Capacity, Snapshots: int64(v.Snapshots), IOPS: auth.IOPS(v.QoS)})
	}
	return u
}

// reserve admits add for tenant and returns the function that releases
// the reservation; it is idempotent. Without a tenant or a store there is
// nothing to check.
func (s *Server) reserve(tenant string, add auth.Quota) (func(), error) {
	if tenant == "" || s.Auth == nil {
		return func() {}, nil
	}
	q := s.Auth.Quota(tenant)
	if q == (auth.Quota{}) {
		return func() {}, nil
	}
	if q.IOPS == 0 {
		add.IOPS = 0 // not counted: pending IOPS stay finite
	}
	s.quotas.mu.Lock()
	defer s.quotas.mu.Unlock()
	used := s.usage(tenant).Add(s.quotas.pending[tenant])
	if err := q.Admit(tenant, used, add); err != nil {
		return nil, err
	}
	if s.quotas.pending == nil {
		s.quotas.pending = map[string]auth.Quota{}
	}
	s.quotas.pending[tenant] = s.quotas.pending[tenant].Add(add)
	var once sync.Once
	return func() {
		once.Do(func() {
			s.quotas.mu.Lock()
			defer s.quotas.mu.Unlock()
			p := s.quotas.pending[tenant]
			p.Volumes -= add.Volumes
			p.Capacity -= add.Capacity
			p.Snapshots -= add.Snapshots
			p.IOPS -= add.IOPS
			if p == (auth.Quota{}) {
				delete(s.quotas.pending, tenant)
			} else {
				s.quotas.pending[tenant] = p
			}
		})
	}, nil
}
