package auth

import "fmt"

// Role says what a token may do, within its tenant when it has one.
type Role string

const (
	// RoleAdmin may do everything, on every tenant's volumes; it has no
	// tenant.
	RoleAdmin Role = "admin"
	// RoleTenant manages its tenant's volumes: create, change, snapshot,
	// clone, delete, attach.
	RoleTenant Role = "tenant"
	// RoleAttach may read its tenant's volumes, create and remove
	// attachments and open exports: what a CSI node plugin needs.
	RoleAttach Role = "attach"
	// RoleMonitor reads and changes nothing; without a tenant it reads the
	// whole node (pool, usage, jobs, metrics).
	RoleMonitor Role = "monitor"
)

// Roles lists every role, for messages and completion.
var Roles = []Role{RoleAdmin, RoleTenant, RoleAttach, RoleMonitor}

// Action is a kind of operation a route or an NBD open needs.
type Action int

const (
	// ActRead reads volumes, snapshots and attachments in scope.
	ActRead Action = iota
	// ActWrite creates, changes and deletes volumes, disks, snapshots and
	// clones, and rolls back.
	ActWrite
	// ActAttach creates and removes attachments and opens NBD exports.
	ActAttach
	// ActNode reads what concerns the whole node: the pool, usage,
	// nodes, every job, metrics.
	ActNode
	// ActAdmin manages tokens and tenants, and changes the node.
	ActAdmin
)

func (a Action) String() string {
	switch a {
	case ActRead:
		return "read"
	case ActWrite:
		return "change volumes"
	case ActAttach:
		return "attach"
	case ActNode:
		return "read the whole node"
	case ActAdmin:
		return "administer tokens and tenants"
	}
	return fmt.Sprintf("action %d", int(a))
}

// ValidateRole checks a role name.
func ValidateRole(r Role) error {
	for _, x := range Roles {
		if r == x {
			return nil
		}
	}
	return fmt.Errorf("role %q: must be one of admin, tenant, attach, monitor: %w", r, ErrInvalid)
}

// Principal is who a request or an NBD connection acts for.
type Principal struct {
	TokenID string // "" for the anonymous admin of a node without tokens
	Tenant  string // "" for every tenant (admin, or a node-wide monitor)
	Role    Role
}

// Anonymous is the caller of a node that requires no token (loopback
// without --token-file, or a local socket): an admin, as before tenants.
var Anonymous = Principal{Role: RoleAdmin}

// Allows reports whether p may perform a.
func (p Principal) Allows(a Action) bool {
	switch p.Role {
	case RoleAdmin:
		return true
	case RoleTenant:
		return a == ActRead || a == ActWrite || a == ActAttach
	case RoleAttach:
		return a == ActRead || a == ActAttach
	case RoleMonitor:
		return a == ActRead || (a == ActNode && p.Tenant == "")
	}
	return false
}

// Check returns nil when p may perform a, else an error matching
// ErrForbidden that names the role and the action.
func (p Principal) Check(a Action) error {
	if p.Allows(a) {
		return nil
	}
	return fmt.Errorf("a %s token may not %s: %w", p.Role, a, ErrForbidden)
}

// Sees reports whether a volume of tenant is in p's scope.
func (p Principal) Sees(tenant string) bool { return p.Tenant == "" || p.Tenant == tenant }
