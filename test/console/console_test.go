package console

import (
	"context"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/testserver"
)

const adminToken = "console-test-admin-token"

// startServer runs a server whose API needs adminToken.
func startServer(t *testing.T) *testserver.Process {
	t.Helper()
	return testserver.StartT(t, quiverBin, testserver.Options{Token: adminToken})
}

// TestConsoleVolumeLifecycle logs in as admin and goes through a volume's
// life in the console: create, snapshot, clone (live and from the
// snapshot), rollback, delete, and a create with a bad name, whose error
// must be the server's own message. The API, asked directly, is the
// oracle for what each step made.
func TestConsoleVolumeLifecycle(t *testing.T) {
	srv := startServer(t)
	ctx := context.Background()
	b := newBrowser(t, "http://"+srv.APIAddr)

	b.login(adminToken)
	if got := b.text(`[data-role]`); got == "" {
		t.Fatal("no role shown after login")
	}
	b.checkPage("overview")

	b.goTo("#/volumes", `input[name="search"]`)
	b.checkPage("volumes-empty")

	// A bad name: the dialog shows what the server answers to it.
	const bad = "Bad_Name!"
	b.act("create-volume", map[string]string{"name": bad, "size": "1"})
	_, want := srv.API.CreateVolume(ctx, api.VolumeSpec{Name: bad, Capacity: 1 << 30,
		Disks: []api.DiskSpec{{Name: "root", Size: 1 << 30}}})
	if want == nil {
		t.Fatalf("the API took volume name %q", bad)
	}
	shown := b.text(`form[data-dialog="create-volume"] .error`)
	if wantText := client.Code(want) + ": " + want.Error(); shown != wantText {
		t.Fatalf("bad name: the console shows %q, the server answers %q", shown, wantText)
	}
	b.checkPage("create-bad-name")
	b.run("cancel", chromedp.Click(chromedp.CSS(`form[data-dialog="create-volume"] button[type="button"]`)))

	// Create: the console lands on the new volume's page.
	b.act("create-volume", map[string]string{"name": "web01", "size": "1", "disks": "2"})
	b.run("volume page", chromedp.WaitVisible(chromedp.CSS(`[data-volume-page="web01"] [data-disk="data1"]`)))
	v, err := srv.API.GetVolume(ctx, "web01")
	if err != nil {
		t.Fatalf("volume made by the console: %v", err)
	}
	if len(v.Disks) != 2 || v.Disks[0].Size != 1<<30 {
		t.Fatalf("volume made by the console: disks %+v, want root and data1 of 1 GiB", v.Disks)
	}

	b.act("snapshot", map[string]string{"name": "snap1"})
	b.waitText(`.notice`, "Snapshot snap1 taken.")
	b.run("snapshot row", chromedp.WaitVisible(chromedp.CSS(`[data-snapshot="snap1"]`)))
	if _, err := srv.API.GetSnapshot(ctx, "web01", "snap1"); err != nil {
		t.Fatalf("snapshot taken in the console: %v", err)
	}
	b.checkPage("volume")

	// A taken snapshot name: the server's message again.
	b.act("snapshot", map[string]string{"name": "snap1"})
	if got := b.text(`form[data-dialog="snapshot"] .error`); !strings.Contains(got, api.CodeConflict) {
		t.Fatalf("snapshot of a taken name: the console shows %q, want the server's %s", got, api.CodeConflict)
	}
	b.run("cancel", chromedp.Click(chromedp.CSS(`form[data-dialog="snapshot"] button[type="button"]`)))

	b.act("clone", map[string]string{"names": "web02"})
	b.waitText(`.notice`, "Cloned to web02.")
	b.act("clone-snapshot-snap1", map[string]string{"names": "web03"})
	b.waitText(`.notice`, "Cloned to web03.")
	for _, name := range []string{"web02", "web03"} {
		c, err := srv.API.GetVolume(ctx, name)
		if err != nil {
			t.Fatalf("clone %s made in the console: %v", name, err)
		}
		if c.Source == nil || c.Source.Volume != "web01" {
			t.Fatalf("clone %s: source %+v, want web01", name, c.Source)
		}
	}

	b.act("rollback-snap1", nil)
	b.waitText(`.notice`, "Rolled back to snap1.")

	// The clone's page names its source.
	b.goTo("#/volumes/web03", `[data-volume-page="web03"] [data-source]`)
	if got := b.text(`[data-source]`); got != "web01@snap1" {
		t.Fatalf("clone web03's source shows %q, want web01@snap1", got)
	}
	b.checkPage("clone")

	// The list shows the three, and search narrows it.
	b.goTo("#/volumes", `[data-volume="web03"]`)
	if n := b.count(`.vlist .body [data-volume]`); n != 3 {
		t.Fatalf("volume list: %d rows, want 3", n)
	}
	b.run("search", chromedp.SendKeys(chromedp.CSS(`input[name="search"]`), "web02"), chromedp.WaitVisible(chromedp.CSS(`[data-count="1"]`)))
	b.checkPage("volumes")

	// Delete web02 (no snapshots) with its confirmation.
	b.goTo("#/volumes/web02", `[data-volume-page="web02"]`)
	b.act("delete-volume", nil)
	b.run("back to the list", chromedp.WaitVisible(chromedp.CSS(`input[name="search"]`)))
	if _, err := srv.API.GetVolume(ctx, "web02"); client.Code(err) != api.CodeNotFound {
		t.Fatalf("web02 after its delete in the console: %v, want %s", err, api.CodeNotFound)
	}
	b.checkPage("after-delete")
}

// TestConsoleMonitor logs in with a monitor token: every page renders,
// with no action button, and the API refuses the monitor's changes.
func TestConsoleMonitor(t *testing.T) {
	srv := startServer(t)
	ctx := context.Background()
	if _, err := srv.API.CreateVolume(ctx, api.VolumeSpec{Name: "db01", Capacity: 1 << 30,
		Disks: []api.DiskSpec{{Name: "root", Size: 1 << 30}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.API.CreateSnapshot(ctx, "db01", "s1"); err != nil {
		t.Fatal(err)
	}
	tok, err := srv.API.CreateToken(ctx, api.TokenSpec{Role: "monitor", Description: "console test"})
	if err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, "http://"+srv.APIAddr)
	b.login(tok.Secret)
	if got := b.text(`[data-role]`); !strings.Contains(got, "monitor") {
		t.Fatalf("role shown: %q", got)
	}
	b.checkPage("monitor-overview")
	b.goTo("#/volumes", `[data-volume="db01"]`)
	if n := b.count(`[data-action]`); n != 0 {
		t.Fatalf("monitor: %d action buttons on the volume list, want none", n)
	}
	b.goTo("#/volumes/db01", `[data-snapshot="s1"]`)
	if n := b.count(`[data-action]`); n != 0 {
		t.Fatalf("monitor: %d action buttons on a volume's page, want none", n)
	}
	b.checkPage("monitor-volume")

	// The buttons are absent, and the API refuses anyway.
	mon, err := srv.ClientWith(tok.Secret)
	if err != nil {
		t.Fatal(err)
	}
	_, err = mon.CreateSnapshot(ctx, "db01", "s2")
	if client.Code(err) != api.CodeForbidden {
		t.Fatalf("monitor's snapshot: %v, want %s", err, api.CodeForbidden)
	}
}
