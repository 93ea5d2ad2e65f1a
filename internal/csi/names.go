package csi

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/quiverstorage/quiver/internal/client"
)

// Labels the plugin puts on the quiver volumes it makes.
const (
	// LabelDriver marks a volume as made by this plugin; its value is the
	// driver name. ListVolumes and ListSnapshots select on it.
	LabelDriver = "quiver.io/csi-driver"
	// LabelName records the CSI name the volume was made for (see
	// nameLabelValue), so a second CreateVolume of the same name finds it
	// and a different name that maps to the same volume name is refused.
	LabelName = "quiver.io/csi-name"
	// LabelReplication records the StorageClass's replication factor. The
	// single-node server stores it; cluster mode will enforce it.
	LabelReplication = "quiver.io/replication"
)

// MaxNameLength is the longest CSI name a CO may send (CSI spec: 128 bytes).
const MaxNameLength = 128

// hashLen is how many hex digits of SHA-256 a mapped name keeps: 64 bits,
// so two CSI names collide with odds of 2^-64 per pair; LabelName catches a
// collision anyway.
const hashLen = 16

// volumeName maps a CSI volume name to a quiver volume name, deterministically:
// a name that is already a DNS label (Kubernetes' "pvc-<uid>") is kept as it
// is, so `quiver volume list` shows the PV's name; any other name becomes a
// lower-cased, DNS-safe prefix of it plus a hash of the whole name.
func volumeName(csiName string) string { return mapName(csiName, validation.DNS1123LabelMaxLength) }

// tenantVolumeName is volumeName for a plugin whose token belongs to a
// tenant, whose volume names have at most max characters (api.WhoAmI,
// docs/security.md "Tenants"): a name that fits is kept as it is, and a
// longer one is cut to a prefix and a hash that fit. With max 63 (no tenant)
// it is volumeName.
func tenantVolumeName(csiName string, max int) string { return mapName(csiName, max) }

// snapshotName maps a CSI snapshot name to a quiver snapshot name, with the
// same rule as volumeName; snapshot names are per volume, so no tenant
// shortens them.
func snapshotName(csiName string) string { return mapName(csiName, validation.DNS1123LabelMaxLength) }

func mapName(name string, maxLen int) string {
	maxLen = min(max(maxLen, 1+1+hashLen), validation.DNS1123LabelMaxLength)
	if isDNSLabel(name) && len(name) <= maxLen {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	hash := hex.EncodeToString(sum[:])[:hashLen]
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(name) {
		ok := (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9')
		switch {
		case ok:
			b.WriteRune(r)
			dash = false
		case !dash && b.Len() > 0:
			b.WriteByte('-')
			dash = true
		}
		if b.Len() >= maxLen-1-hashLen {
			break
		}
	}
	prefix := strings.Trim(b.String(), "-")
	if len(prefix) > maxLen-1-hashLen {
		prefix = strings.TrimRight(prefix[:maxLen-1-hashLen], "-")
	}
	if prefix == "" {
		prefix = "csi"
	}
	return prefix + "-" + hash
}

// nameLabelValue is the value of LabelName for a CSI name: the name itself
// when it is a valid label value, else "sha256-" and 56 hex digits of its
// hash (label values hold at most 63 characters).
func nameLabelValue(csiName string) string {
	if len(validation.IsValidLabelValue(csiName)) == 0 {
		return csiName
	}
	sum := sha256.Sum256([]byte(csiName))
	return "sha256-" + hex.EncodeToString(sum[:])[:56]
}

func isDNSLabel(s string) bool { return len(validation.IsDNS1123Label(s)) == 0 }

// required checks that request fields are set, in the order given:
// fieldValues alternates a field's name and its value. The first empty one
// is InvalidArgument.
func required(fieldValues ...string) error {
	for i := 0; i+1 < len(fieldValues); i += 2 {
		if fieldValues[i+1] == "" {
			return fmt.Errorf("%s is required: %w", fieldValues[i], ErrInvalid)
		}
	}
	return nil
}

// checkName checks a CSI name sent by the CO.
func checkName(field, name string) error {
	if err := required(field, name); err != nil {
		return err
	}
	if len(name) > MaxNameLength {
		return fmt.Errorf("%s %q: at most %d bytes: %w", field, name, MaxNameLength, ErrInvalid)
	}
	return nil
}

// A volume ID is the quiver volume name: everything a node needs to find
// the volume through the API (its directory, its disks, its NBD exports).
//
// parseVolumeID checks a volume ID from the CO: empty is InvalidArgument;
// anything that is not a quiver volume name cannot name a volume, so it is
// NotFound.
func parseVolumeID(field, id string) (string, error) {
	if err := required(field, id); err != nil {
		return "", err
	}
	if !isDNSLabel(id) {
		return "", fmt.Errorf("volume %q: not a quiver volume ID: %w", id, ErrNotFound)
	}
	return id, nil
}

// A snapshot ID is "<volume>@<snapshot>", quiver's own notation for a
// snapshot of a volume.
func snapshotID(volume, snapshot string) string { return volume + "@" + snapshot }

// parseSnapshotID splits a snapshot ID; one that this plugin cannot have
// made is NotFound.
func parseSnapshotID(field, id string) (volume, snapshot string, err error) {
	if err := required(field, id); err != nil {
		return "", "", err
	}
	volume, snapshot, ok := strings.Cut(id, "@")
	if !ok || !isDNSLabel(volume) || !isDNSLabel(snapshot) {
		return "", "", fmt.Errorf("snapshot %q: not a quiver snapshot ID (want <volume>@<snapshot>): %w", id, ErrNotFound)
	}
	return volume, snapshot, nil
}

// Pagination tokens are "after:<id>": the listing goes on with the first
// entry whose ID sorts after <id>, so entries deleted between pages shift
// nothing and none is listed twice.
const tokenPrefix = "after:"

func nextToken(lastID string) string { return tokenPrefix + lastID }

// parseToken returns the ID a token continues after ("" for no token).
func parseToken(token string, valid func(string) bool) (string, error) {
	if token == "" {
		return "", nil
	}
	id, ok := strings.CutPrefix(token, tokenPrefix)
	if !ok || !valid(id) {
		return "", fmt.Errorf("starting_token %q: not a token this plugin returned: %w", token, ErrBadToken)
	}
	return id, nil
}

// checkMaxEntries checks a list request's max_entries.
func checkMaxEntries(n int32) error {
	if n < 0 {
		return fmt.Errorf("max_entries %d: must not be negative: %w", n, ErrInvalid)
	}
	return nil
}

// page sorts items by ID and returns the page that starts after the ID
// after ("" for the first page) and holds at most maxEntries items (0 for
// no limit), with the token of the next page ("" for the last).
func page[T any](items []T, id func(T) string, after string, maxEntries int32) ([]T, string) {
	slices.SortFunc(items, func(a, b T) int { return strings.Compare(id(a), id(b)) })
	var out []T
	for _, it := range items {
		if after != "" && id(it) <= after {
			continue
		}
		if max := int(maxEntries); max > 0 && len(out) == max {
			return out, nextToken(id(out[len(out)-1]))
		}
		out = append(out, it)
	}
	return out, ""
}

// requestKey is the idempotency key the plugin sends with a create (quiver
// refuses a taken name unless the retry carries the key the object was made
// with): the kind of request and a hash of what names it, the same on every
// retry and after a restart of the plugin, so CreateVolume, CreateSnapshot
// and ControllerPublishVolume stay idempotent as CSI requires.
func requestKey(kind string, names ...string) client.CallOption {
	sum := sha256.Sum256([]byte(strings.Join(names, "\x00")))
	return client.IdempotencyKey("csi-" + kind + "-" + hex.EncodeToString(sum[:]))
}
