package pool

import (
	"fmt"
	"strings"
)

// Tenants in the pool's layout (docs/security.md, "Tenants").
//
// A volume's tenant is the tenant field of its manifest, set at creation and
// never changed; it is what every access check reads. Volume names are unique
// per tenant: a tenant's volume "web" is the pool volume "<tenant>--web"
// (TenantVolumeName), in volumes/<tenant>--web/ like any other volume, and
// that is also its name in NBD export names given with an attachment token.
// The prefix only keeps the names of two tenants apart; it grants nothing: a
// manifest whose name does not carry its tenant's prefix, or that carries a
// prefix without the tenant field, is refused (the volume is quarantined).

// TenantSeparator joins a tenant and a tenant's volume name into a pool
// volume name. Tenant names cannot hold it, so the split is unambiguous.
const TenantSeparator = "--"

// MaxTenantName bounds a tenant name, so that a tenant's volume names keep
// 63-16-2 = 45 characters: Kubernetes' "pvc-<uid>" (40) fits.
const MaxTenantName = 16

// ValidateTenant checks a tenant name: a DNS label of at most MaxTenantName
// characters without "--".
func ValidateTenant(field, t string) error {
	if t == "" {
		return invalid(field, "", "is required")
	}
	if err := ValidateName(field, t); err != nil {
		return err
	}
	if len(t) > MaxTenantName || strings.Contains(t, TenantSeparator) {
		return invalid(field, t, fmt.Sprintf("a tenant name has at most %d characters and no %q", MaxTenantName, TenantSeparator))
	}
	return nil
}

// TenantVolumeName returns the pool volume name of tenant's volume name, or
// name itself when tenant is "".
func TenantVolumeName(tenant, name string) string {
	if tenant == "" {
		return name
	}
	return tenant + TenantSeparator + name
}

// MaxTenantVolumeName is the longest volume name tenant may use.
func MaxTenantVolumeName(tenant string) int {
	if tenant == "" {
		return 63
	}
	return 63 - len(tenant) - len(TenantSeparator)
}

// TenantLocalName returns the name tenant knows the pool volume name by,
// and false when the name is not in tenant's part of the pool.
func TenantLocalName(tenant, poolName string) (string, bool) {
	if tenant == "" {
		return poolName, true
	}
	local, ok := strings.CutPrefix(poolName, tenant+TenantSeparator)
	return local, ok && local != ""
}

// ValidateVolumeTenant checks that a pool volume name and its tenant field
// agree: with a tenant the name is TenantVolumeName(tenant, a DNS label);
// without one the name is any DNS label.
func ValidateVolumeTenant(name, tenant string) error {
	if tenant == "" {
		return nil
	}
	if err := ValidateTenant("tenant", tenant); err != nil {
		return err
	}
	local, ok := TenantLocalName(tenant, name)
	if !ok {
		return invalid("name", name, fmt.Sprintf("a volume of tenant %q is named %q followed by its name", tenant, tenant+TenantSeparator))
	}
	return ValidateName("name", local)
}

// Tenant returns the volume's tenant, from its manifest; "" for none and for
// a quarantined volume (which only an admin sees).
func (v *Volume) Tenant() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.m.Tenant
}
