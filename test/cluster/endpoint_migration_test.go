package clustertest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/endpoint"
	"github.com/quiverstorage/quiver/internal/testfs"
	guestrecord "github.com/quiverstorage/quiver/test/migration/record"
)

// computeNode is one compute node of the migration test: its endpoint and
// the attachment the CSI driver made for it (none while no VM runs there).
type computeNode struct {
	name string
	dir  string
	ep   *endpointProc
	ctl  *endpoint.Client
	att  api.Attachment
}

// TestEndpointMigration is acceptance 3 of issue 30 with QEMU's own live
// migration: a guest (the guest writer, three disks of a replicas=2 volume)
// is migrated ten times between two compute nodes, each with its own
// endpoint and its own attachment, as the CSI driver makes them: before
// each migration the destination node gets a new attachment
// (ControllerPublishVolume) that its endpoint publishes (NodeStageVolume),
// and QEMU there starts with -incoming and its disks on that endpoint's
// socket; after it, once the destination wrote, the source's attachment
// must be fenced, and it is detached and unpublished (the source's
// NodeUnstageVolume and ControllerUnpublishVolume). No request may fail on
// either side and no I/O error reach the console; at the end each disk on
// the primary must hold exactly the records all the QEMUs completed,
// intact. QUIVER_ENDPOINT_MIGRATIONS sets the count (default 10).
func TestEndpointMigration(t *testing.T) {
	migrations := envCount(t, "QUIVER_ENDPOINT_MIGRATIONS", 10)
	testfs.RequireTool(t, "qemu-system-x86_64")
	c, k, initrd, v := startEndpointRig(t, "mig")
	ctx := context.Background()
	root := shortTempDir(t, "qem")
	var nodes [2]*computeNode
	for i := range nodes {
		cn := &computeNode{name: fmt.Sprintf("compute-%d", i+1), dir: filepath.Join(root, fmt.Sprint(i+1))}
		if err := os.MkdirAll(cn.dir, 0o700); err != nil {
			t.Fatal(err)
		}
		cn.ep = c.startEndpoint(t, cn.dir, c.nodes...)
		cn.ctl = endpoint.NewClient(filepath.Join(cn.dir, "ep.sock"))
		nodes[i] = cn
	}
	// publish attaches the volume for cn and publishes it at cn's endpoint;
	// it returns the disks' QEMU sources there.
	publish := func(cn *computeNode) func(d string) map[string]any {
		t.Helper()
		var pub endpoint.Published
		cn.att, pub = c.publishAt(t, cn.ctl, v, cn.name)
		return func(d string) map[string]any {
			i := slices.Index(endpointDisks, d)
			return map[string]any{"server": map[string]string{"type": "unix", "path": pub.Socket}, "export": volumeDisks[i]}
		}
	}
	src := nodes[0]
	vm := startGuestVM(t, c, k, initrd, endpointDisks, publish(src))
	vm.waitStarted(t)
	completed := map[string]int64{} // writes completed by the QEMUs that ended
	var downtimes []string
	for i := range migrations {
		dst := nodes[(i+1)%2]
		vm.waitWrites(t, vm.writes(t)["vda"].WrOperations+30, 2*time.Minute)
		dvm := startGuestVM(t, c, k, initrd, endpointDisks, publish(dst), "-incoming", "defer")
		uri := "unix:" + filepath.Join(root, fmt.Sprintf("migrate-%d.sock", i))
		if err := dvm.qmp.Execute(ctx, "migrate-incoming", map[string]any{"uri": uri}, nil); err != nil {
			t.Fatal(err)
		}
		if err := vm.qmp.Execute(ctx, "migrate", map[string]any{"uri": uri}, nil); err != nil {
			t.Fatal(err)
		}
		info := waitMigrated(t, ctx, vm)
		downtimes = append(downtimes, fmt.Sprintf("%dms", info.Downtime))
		// The destination runs the guest and writes: its first write takes
		// the writer role and fences the source's attachment.
		dvm.waitWrites(t, 20, 2*time.Minute)
		old, err := c.nodes[1].api().GetAttachment(ctx, "mig", src.att.ID)
		if err != nil {
			t.Fatal(err)
		}
		now, err := c.nodes[2].api().GetAttachment(ctx, "mig", dst.att.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !old.Fenced || old.Writer || !now.Writer || now.Fenced {
			t.Fatalf("migration %d: after the switch the source's attachment is %s (fenced %v), the destination's %s (writer %v): want the source fenced",
				i, old.State, old.Fenced, now.State, now.Writer)
		}
		vm.checkHealthy(t)
		for d, s := range vm.writes(t) {
			completed[d] += s.WrOperations
		}
		_ = vm.qmp.Execute(ctx, "quit", nil, nil) // QEMU may close QMP before it answers
		select {
		case <-vm.Exited():
		case <-time.After(30 * time.Second):
			t.Fatal("the source QEMU did not quit")
		}
		if err := c.nodes[0].api().Detach(ctx, "mig", src.att.ID); err != nil {
			t.Fatal(err)
		}
		if err := src.ctl.Unpublish(ctx, "mig"); err != nil {
			t.Fatal(err)
		}
		t.Logf("migration %d: %s -> %s in %d ms (downtime %d ms); %s fenced, %s writes (epoch moved)",
			i, src.name, dst.name, info.TotalTime, info.Downtime, src.name, dst.name)
		vm, src = dvm, dst
	}
	vm.waitWrites(t, 30, 2*time.Minute)
	if err := vm.qmp.Execute(ctx, "stop", nil, nil); err != nil {
		t.Fatal(err)
	}
	vm.checkHealthy(t)
	for d, s := range vm.writes(t) {
		completed[d] += s.WrOperations
	}
	final := c.waitVolume(t, c.nodes[0], "mig", "both copies in sync", bothInSync)
	fp := c.byName(final.Primary)
	for di, d := range endpointDisks {
		img, err := os.ReadFile(filepath.Join(fp.pool, "volumes", "mig", "disks", volumeDisks[di]+".img"))
		if err != nil {
			t.Fatal(err)
		}
		n, err := guestrecord.Count(img, uint64(di))
		if err != nil {
			t.Fatalf("%s on the primary %s: %v", d, fp.name, err)
		}
		if n != completed[d] {
			t.Fatalf("%s on the primary %s holds records 0..%d; the QEMUs completed %d writes", d, fp.name, n-1, completed[d])
		}
		t.Logf("%s: records 0..%d intact on %s, as many as the %d QEMUs completed", d, n-1, fp.name, migrations+1)
	}
	t.Logf("%d migrations between two compute nodes, each through its own endpoint: downtimes %v", migrations, downtimes)
}

// migrated is what the test reads of QMP query-migrate (milliseconds).
type migrated struct {
	Status    string `json:"status"`
	TotalTime int64  `json:"total-time"`
	Downtime  int64  `json:"downtime"`
	ErrorDesc string `json:"error-desc"`
}

// waitMigrated polls query-migrate on the source until it completed; a
// failed or cancelled migration fails the test.
func waitMigrated(t *testing.T, ctx context.Context, vm *guestVM) migrated {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		var m migrated
		if err := vm.qmp.Execute(ctx, "query-migrate", nil, &m); err != nil {
			t.Fatal(err)
		}
		switch m.Status {
		case "completed":
			return m
		case "failed", "cancelled":
			t.Fatalf("migration %s: %s", m.Status, m.ErrorDesc)
		}
		if time.Now().After(deadline) {
			t.Fatalf("migration still %q after 3 minutes", m.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
