package csi

import (
	"errors"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/quiverstorage/quiver/internal/api"
)

func TestVolumeName(t *testing.T) {
	cases := []struct{ in, want string }{
		{"pvc-0b5c2a4e-8d0f-4c8e-9a53-1f3c2d4e5f60", "pvc-0b5c2a4e-8d0f-4c8e-9a53-1f3c2d4e5f60"},
		{"web01", "web01"},
	}
	for _, c := range cases {
		if got := volumeName(c.in); got != c.want {
			t.Errorf("volumeName(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	seen := map[string]string{}
	for _, in := range []string{"Web01", "web_01", "web.01", strings.Repeat("a", 64), strings.Repeat("a", 128),
		strings.Repeat("a", 127) + "b", "---", "Ünïcödé", "UPPER-case-" + strings.Repeat("Z", 100), "-web01"} {
		got := volumeName(in)
		if errs := validation.IsDNS1123Label(got); len(errs) > 0 {
			t.Errorf("volumeName(%q) = %q, not a DNS label: %v", in, got, errs)
		}
		if got != volumeName(in) {
			t.Errorf("volumeName(%q) is not deterministic", in)
		}
		if prev, ok := seen[got]; ok {
			t.Errorf("volumeName(%q) = volumeName(%q) = %q", in, prev, got)
		}
		seen[got] = in
		if v := nameLabelValue(in); len(validation.IsValidLabelValue(v)) > 0 {
			t.Errorf("nameLabelValue(%q) = %q, not a label value", in, v)
		}
	}
	if nameLabelValue(strings.Repeat("a", 128)) == nameLabelValue(strings.Repeat("a", 127)+"b") {
		t.Error("two long names share a label value")
	}
}

func TestIDsAndTokens(t *testing.T) {
	v, s, err := parseSnapshotID("snapshot_id", snapshotID("web01", "nightly"))
	if err != nil || v != "web01" || s != "nightly" {
		t.Fatalf("round trip: %q %q %v", v, s, err)
	}
	for _, bad := range []string{"web01", "web01@", "@snap", "Web01@snap", "a@b@c"} {
		if _, _, err := parseSnapshotID("snapshot_id", bad); !errors.Is(err, ErrNotFound) {
			t.Errorf("parseSnapshotID(%q) = %v, want ErrNotFound", bad, err)
		}
	}
	if _, _, err := parseSnapshotID("snapshot_id", ""); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty snapshot ID: %v, want ErrInvalid", err)
	}
	if id, err := parseToken(nextToken("web01"), isDNSLabel); err != nil || id != "web01" {
		t.Errorf("token round trip: %q %v", id, err)
	}
	for _, bad := range []string{"invalid-token", "after:", "after:Web01", "web01"} {
		if _, err := parseToken(bad, isDNSLabel); !errors.Is(err, ErrBadToken) {
			t.Errorf("parseToken(%q) = %v, want ErrBadToken", bad, err)
		}
	}
}

func TestParseParams(t *testing.T) {
	p, err := parseParams(map[string]string{
		"disks": "root=40Gi, data=100Gi", "qos_rw_iops": "500", "qos_rw_mbytes": "50", "replication": "2",
		"csi.storage.k8s.io/pvc/name": "vm1-disks", "csi.storage.k8s.io/pvc/namespace": "tenant-a",
		"csi.storage.k8s.io/pv/name": "pvc-123", "encrypted": "true",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []api.DiskSpec{{Name: "root", Size: 40 << 30}, {Name: "data", Size: 100 << 30}}
	if len(p.Disks) != 2 || p.Disks[0] != want[0] || p.Disks[1] != want[1] {
		t.Errorf("disks %+v, want %+v", p.Disks, want)
	}
	if p.QoS == nil || *p.QoS != (api.QoS{RWIOPS: 500, RWMBytes: 50}) {
		t.Errorf("QoS %+v", p.QoS)
	}
	if p.Labels[LabelReplication] != "2" || p.Labels[LabelPVCName] != "vm1-disks" || p.Labels[LabelPVCNamespace] != "tenant-a" {
		t.Errorf("labels %v", p.Labels)
	}
	if p.Encrypted == nil || !*p.Encrypted {
		t.Errorf("encrypted %v, want true", p.Encrypted)
	}
	if _, err := parseParams(map[string]string{"encrypted": "yes"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("encrypted=yes: %v, want ErrInvalid", err)
	}
	if p, err := parseParams(nil); err != nil || p.Disks != nil || p.QoS != nil || p.Encrypted != nil {
		t.Errorf("no parameters: %+v %v", p, err)
	}
}

func TestCapacityFor(t *testing.T) {
	const gi = int64(1) << 30
	cases := []struct {
		required, limit, need, want int64
		err                         error
	}{
		{0, 0, 0, DefaultCapacity, nil},
		{0, 0, 3 * gi, 3 * gi, nil},
		{gi, 0, 0, gi, nil},
		{gi + 1, 0, 0, gi + 512, nil},
		{0, 100 << 20, 0, 100 << 20, nil},
		{0, 1000, 0, 512, nil},
		{gi, 2 * gi, 3 * gi, 0, ErrOutOfRange},
		{gi, 0, 3 * gi, 3 * gi, nil},
		{2 * gi, gi, 0, 0, ErrInvalid},
		{-1, 0, 0, 0, ErrInvalid},
		{0, 100, 0, 0, ErrOutOfRange},
		{1 << 62, 0, 0, 0, ErrOutOfRange},
	}
	for _, c := range cases {
		got, err := capacityFor(&csi.CapacityRange{RequiredBytes: c.required, LimitBytes: c.limit}, c.need)
		if got != c.want || !errors.Is(err, c.err) && !(err == nil && c.err == nil) {
			t.Errorf("capacityFor(%d, %d, need %d) = %d, %v; want %d, %v", c.required, c.limit, c.need, got, err, c.want, c.err)
		}
	}
}

// TestTenantVolumeName: with a tenant's token the plugin's volume names fit
// the tenant's limit (63 less "<tenant>--", api.WhoAmI): Kubernetes'
// "pvc-<uid>" (40 characters) is kept for any tenant name up to 16
// characters; a longer name is cut to a prefix and a hash that fit; with the
// whole 63 it is volumeName.
func TestTenantVolumeName(t *testing.T) {
	pvc := "pvc-0b5c2a4e-8d0f-4c8e-9a53-1f3c2d4e5f60"
	long := "sanity-controller-create-single-with-capacity-0123456789abcdef"
	for _, max := range []int{45, 55, 63} {
		if got := tenantVolumeName(pvc, max); got != pvc {
			t.Errorf("tenantVolumeName(%q, %d) = %q, want it kept", pvc, max, got)
		}
		seen := map[string]string{}
		for _, in := range []string{long, long + "x", "Web_01", strings.Repeat("a", 128)} {
			got := tenantVolumeName(in, max)
			if len(got) > max || len(validation.IsDNS1123Label(got)) > 0 {
				t.Errorf("tenantVolumeName(%q, %d) = %q: over %d characters or not a DNS label", in, max, got, max)
			}
			if prev, ok := seen[got]; ok {
				t.Errorf("tenantVolumeName(%q) = tenantVolumeName(%q) = %q", in, prev, got)
			}
			seen[got] = in
		}
	}
	for _, in := range []string{pvc, long, "Web_01", strings.Repeat("a", 128)} {
		if a, b := tenantVolumeName(in, 63), volumeName(in); a != b {
			t.Errorf("tenantVolumeName(%q, 63) = %q, volumeName = %q", in, a, b)
		}
	}
}
