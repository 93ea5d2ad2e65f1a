package interop

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
)

// TestAttachURIsWorkInQemuIO: the URIs `quiver attach create` prints are
// what qemu-io needs, token included: a write through one is read back
// through the other disk's URI untouched and through the same URI intact.
func TestAttachURIsWorkInQemuIO(t *testing.T) {
	requireTools(t, "qemu-io")
	s := startServer(t)
	s.createVolume(t, "vm", disk("root", 4*miB), disk("data", 4*miB))
	out := run(t, quiverBin, "--server", s.APIAddr, "attach", "create", "vm", "node-a", "-o", "json")
	var att api.Attachment
	if err := json.Unmarshal([]byte(out), &att); err != nil {
		t.Fatalf("attach create -o json: %v\n%s", err, out)
	}
	root, data := att.URIs["root"], att.URIs["data"]
	if !strings.HasPrefix(root, "nbd://"+s.NBDAddr+"/vm/root/") || !strings.HasSuffix(root, att.Token) || data == "" {
		t.Fatalf("URIs = %v (NBD at %s, token %s)", att.URIs, s.NBDAddr, att.Token)
	}
	table := run(t, quiverBin, "--server", s.APIAddr, "attach", "create", "vm", "node-b", "--mode", "ro")
	if !strings.Contains(table, "URI root:") || !strings.Contains(table, "nbd://"+s.NBDAddr+"/vm/root/") {
		t.Fatalf("attach create prints no URI:\n%s", table)
	}
	run(t, "qemu-io", "-f", "raw", "-c", "write -P 0x5a 0 64k", root)
	run(t, "qemu-io", "-f", "raw", "-r", "-c", "read -P 0x5a 0 64k", root)
	run(t, "qemu-io", "-f", "raw", "-r", "-c", "read -P 0 0 64k", data)
}
