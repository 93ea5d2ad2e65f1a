package main

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
)

// File capabilities (-cap): a file of the layer carries the extended
// attribute security.capability, which the tar holds as the PAX record
// SCHILY.xattr.security.capability (what GNU tar --xattrs, containerd and
// podman read and write). Its value is the kernel's struct vfs_cap_data,
// revision 2 (linux/capability.h): five little-endian 32-bit words,
//
//	magic_etc                     VFS_CAP_REVISION_2 (0x02000000) | VFS_CAP_FLAGS_EFFECTIVE (1)
//	permitted, inheritable        capabilities 0 to 31
//	permitted, inheritable        capabilities 32 to 63
//
// Revision 2 is what setcap writes outside a user namespace; revision 3
// adds the root UID of a user namespace, which an image has no business
// fixing.

// paxCapability is the PAX record of a file's capabilities.
const paxCapability = "SCHILY.xattr.security.capability"

const (
	vfsCapRevision2 = 0x02000000
	vfsCapEffective = 0x000001
)

// capNumbers are the capabilities by name, as linux/capability.h numbers
// them and libcap's text form (cap_from_text) names them.
var capNumbers = map[string]uint{
	"cap_chown": 0, "cap_dac_override": 1, "cap_dac_read_search": 2, "cap_fowner": 3, "cap_fsetid": 4,
	"cap_kill": 5, "cap_setgid": 6, "cap_setuid": 7, "cap_setpcap": 8, "cap_linux_immutable": 9,
	"cap_net_bind_service": 10, "cap_net_broadcast": 11, "cap_net_admin": 12, "cap_net_raw": 13,
	"cap_ipc_lock": 14, "cap_ipc_owner": 15, "cap_sys_module": 16, "cap_sys_rawio": 17, "cap_sys_chroot": 18,
	"cap_sys_ptrace": 19, "cap_sys_pacct": 20, "cap_sys_admin": 21, "cap_sys_boot": 22, "cap_sys_nice": 23,
	"cap_sys_resource": 24, "cap_sys_time": 25, "cap_sys_tty_config": 26, "cap_mknod": 27, "cap_lease": 28,
	"cap_audit_write": 29, "cap_audit_control": 30, "cap_setfcap": 31, "cap_mac_override": 32,
	"cap_mac_admin": 33, "cap_syslog": 34, "cap_wake_alarm": 35, "cap_block_suspend": 36, "cap_audit_read": 37,
	"cap_perfmon": 38, "cap_bpf": 39, "cap_checkpoint_restore": 40,
}

// fileCaps are the capabilities of one file: bit n of a set is
// capability n.
type fileCaps struct {
	permitted, inheritable uint64
	effective              bool
}

// parseCaps reads one clause of libcap's text form: names, comma-separated
// (cap_net_bind_service, or a capability's number, 0 to 63), then + or =,
// then the sets among e, i and p that they go into:
// "cap_net_bind_service+ep", "cap_sys_admin,cap_net_admin=p", "10+ep".
// The effective flag is one bit for the whole file (the kernel raises
// every permitted capability at exec when it is set), so e needs p or i.
func parseCaps(s string) (fileCaps, error) {
	i := strings.IndexAny(s, "+=")
	if i < 0 {
		return fileCaps{}, fmt.Errorf("capabilities %q: want NAMES+FLAGS, as cap_net_bind_service+ep", s)
	}
	names, flags := s[:i], s[i+1:]
	var set uint64
	for _, n := range strings.Split(names, ",") {
		n = strings.ToLower(strings.TrimSpace(n))
		num, ok := capNumbers[n]
		if !ok {
			v, err := strconv.ParseUint(n, 10, 8)
			if err != nil || v > 63 {
				return fileCaps{}, fmt.Errorf("capabilities %q: %q is neither a capability's name (cap_net_bind_service) nor its number (0 to 63)", s, n)
			}
			num = uint(v)
		}
		set |= 1 << num
	}
	var c fileCaps
	if flags == "" {
		return fileCaps{}, fmt.Errorf("capabilities %q: no set after %q: give e, i, p or several", s, s[i])
	}
	for _, f := range flags {
		switch f {
		case 'e':
			c.effective = true
		case 'i':
			c.inheritable = set
		case 'p':
			c.permitted = set
		default:
			return fileCaps{}, fmt.Errorf("capabilities %q: set %q: must be e, i or p", s, f)
		}
	}
	if c.effective && c.permitted == 0 && c.inheritable == 0 {
		return fileCaps{}, fmt.Errorf("capabilities %q: e alone raises nothing: give p or i with it", s)
	}
	return c, nil
}

// xattr is the value of security.capability for c (struct vfs_cap_data,
// revision 2).
func (c fileCaps) xattr() []byte {
	b := make([]byte, 20)
	magic := uint32(vfsCapRevision2)
	if c.effective {
		magic |= vfsCapEffective
	}
	binary.LittleEndian.PutUint32(b[0:], magic)
	binary.LittleEndian.PutUint32(b[4:], uint32(c.permitted))
	binary.LittleEndian.PutUint32(b[8:], uint32(c.inheritable))
	binary.LittleEndian.PutUint32(b[12:], uint32(c.permitted>>32))
	binary.LittleEndian.PutUint32(b[16:], uint32(c.inheritable>>32))
	return b
}
