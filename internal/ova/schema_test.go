package ova

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestDescriptorValidatesAgainstDMTFSchema checks what WriteDescriptor
// writes with xmllint against the DMTF OVF envelope schema (DSP8023) and
// the CIM schemas it imports. Those files are DMTF's and are not shipped
// here or by Debian: point QUIVER_OVF_SCHEMA at dsp8023_1.1.x.xsd, with its
// imports (common.xsd, CIM_*.xsd, xml.xsd, ...) beside it. How to get them
// and the last recorded run are in docs/import-export.md.
func TestDescriptorValidatesAgainstDMTFSchema(t *testing.T) {
	schema := os.Getenv("QUIVER_OVF_SCHEMA")
	if schema == "" {
		t.Skip("QUIVER_OVF_SCHEMA is not set (the DMTF OVF schema is not shipped with quiver): see docs/import-export.md")
	}
	xmllint, err := exec.LookPath("xmllint")
	if err != nil {
		t.Fatal("QUIVER_OVF_SCHEMA is set but xmllint is missing (Debian: libxml2-utils)")
	}
	cases := map[string][]ExportDisk{
		"one disk":    {{Name: "root", File: "vm-root.vmdk", Capacity: 10 << 30}},
		"three disks": {{Name: "root", File: "a.vmdk", Capacity: 1 << 30}, {Name: "data", File: "b.vmdk", Capacity: 3 << 20}, {Name: "logs & <x>", File: "c.vmdk", Capacity: 512}},
	}
	for name, disks := range cases {
		t.Run(name, func(t *testing.T) {
			var b bytes.Buffer
			if err := WriteDescriptor(&b, "web01", disks); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "vm.ovf")
			if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(xmllint, "--noout", "--nonet", "--schema", schema, path).CombinedOutput()
			if err != nil {
				t.Fatalf("xmllint refuses the descriptor: %v\n%s\n%s", err, out, b.String())
			}
		})
	}
}
