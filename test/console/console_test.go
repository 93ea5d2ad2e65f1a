package console

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/nbdclient"
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

	// A wrong token: the server's refusal on the login page.
	b.run("login page", chromedp.Navigate(b.base+"/ui/"), chromedp.WaitVisible(chromedp.CSS(`input[name="token"]`)))
	b.fill(`input[name="token"]`, "not-a-token")
	b.run("sign in", chromedp.Click(chromedp.CSS(`form.login button[type="submit"]`)))
	if got := b.text(`form.login .error`); !strings.HasPrefix(got, api.CodeUnauthorized+": ") {
		t.Fatalf("wrong token: the login page shows %q, want the server's %s", got, api.CodeUnauthorized)
	}
	b.checkPage("login")

	b.login(adminToken)
	if got := b.text(`[data-role]`); !strings.HasPrefix(got, "admin") {
		t.Fatalf("role shown after login: %q", got)
	}
	b.checkPage("overview-empty")

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

	// Rollback under a connected writer: the server refuses, and the
	// dialog shows its message; once the writer is gone it succeeds.
	att, err := srv.API.Attach(ctx, "web01", api.AttachmentSpec{Node: "host-a"})
	if err != nil {
		t.Fatal(err)
	}
	writer, err := nbdclient.Dial(ctx, "", "web01/root/"+att.Token, nbdclient.Options{Timeout: 10 * time.Second,
		Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", srv.Socket)
		}})
	if err != nil {
		t.Fatal(err)
	}
	if err := writer.WriteAt(make([]byte, 4096), 0, true); err != nil {
		t.Fatal(err)
	}
	_, want = srv.API.Rollback(ctx, "web01", "snap1")
	if client.Code(want) != api.CodeInUse {
		t.Fatalf("rollback under a writer, asked of the API: %v, want %s", want, api.CodeInUse)
	}
	b.goTo("#/volumes", `[data-volume="web01"]`)
	b.goTo("#/volumes/web01", `[data-attachment]`)
	b.act("rollback-snap1", nil)
	if got, wantText := b.text(`form[data-dialog="rollback-snap1"] .error`), api.CodeInUse+": "+want.Error(); got != wantText {
		t.Fatalf("rollback under a writer: the console shows %q, the server answers %q", got, wantText)
	}
	b.checkPage("rollback-refused")
	b.run("cancel", chromedp.Click(chromedp.CSS(`form[data-dialog="rollback-snap1"] button[type="button"]`)))
	writer.Close()
	if err := srv.API.Detach(ctx, "web01", att.ID); err != nil {
		t.Fatal(err)
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

	// The overview counts what is left: web01 and web03.
	b.goTo("#/", `[data-card="volumes"]`)
	if got := b.text(`[data-card="volumes"] .big`); got != "2" {
		t.Fatalf("overview: %q volumes, want 2", got)
	}
	b.checkPage("overview")
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

// TestConsoleTenant logs in with a tenant's token: the list holds the
// tenant's volumes only, by its own names, and another tenant's volume is
// not found through the console either.
func TestConsoleTenant(t *testing.T) {
	srv := startServer(t)
	ctx := context.Background()
	tokens := map[string]string{}
	for _, tenant := range []string{"acme", "globex"} {
		tok, err := srv.API.CreateToken(ctx, api.TokenSpec{Tenant: tenant, Role: "tenant", Description: "console test"})
		if err != nil {
			t.Fatal(err)
		}
		tokens[tenant] = tok.Secret
		c, err := srv.ClientWith(tok.Secret)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.CreateVolume(ctx, api.VolumeSpec{Name: tenant + "-vm", Capacity: 1 << 30,
			Disks: []api.DiskSpec{{Name: "root", Size: 1 << 30}}}); err != nil {
			t.Fatal(err)
		}
	}
	b := newBrowser(t, "http://"+srv.APIAddr)
	b.login(tokens["acme"])
	if got := b.text(`[data-role]`); !strings.HasPrefix(got, "tenant of acme") {
		t.Fatalf("role shown: %q", got)
	}
	b.checkPage("tenant-overview")
	b.goTo("#/volumes", `[data-volume="acme-vm"]`)
	if n := b.count(`.vlist .body [data-volume]`); n != 1 {
		t.Fatalf("tenant acme: %d volumes listed, want its one", n)
	}
	if n := b.count(`[data-action="create-volume"]`); n != 1 {
		t.Fatalf("tenant acme: %d create buttons, want 1", n)
	}
	b.checkPage("tenant-volumes")
	// Globex's volume, by either name, is not found for acme, nor its I/O
	// counters.
	acme, err := srv.ClientWith(tokens["acme"])
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"globex-vm", "globex--globex-vm"} {
		b.goTo("#/volumes/"+name, `.error`)
		if got := b.text(`.error`); !strings.HasPrefix(got, api.CodeNotFound+": ") {
			t.Fatalf("acme opening %s: %q, want %s", name, got, api.CodeNotFound)
		}
		if _, err := acme.VolumeStats(ctx, name); client.Code(err) != api.CodeNotFound {
			t.Fatalf("acme reading %s's I/O counters: %v, want %s", name, err, api.CodeNotFound)
		}
	}
	// Its own volume's counters, by its own name, count its writes.
	att, err := acme.Attach(ctx, "acme-vm", api.AttachmentSpec{Node: "host-a"})
	if err != nil {
		t.Fatal(err)
	}
	writer, err := nbdclient.Dial(ctx, "", "acme-vm/root/"+att.Token, nbdclient.Options{Timeout: 10 * time.Second,
		Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", srv.Socket)
		}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := writer.WriteAt(make([]byte, 8192), int64(i)*8192, false); err != nil {
			t.Fatal(err)
		}
	}
	writer.Close()
	if s, err := acme.VolumeStats(ctx, "acme-vm"); err != nil || s.Volume != "acme-vm" || s.WriteOps != 3 || s.WriteBytes != 3*8192 {
		t.Fatalf("acme reading its own volume's I/O counters after 3 writes of 8 KiB: %+v, %v", s, err)
	}
	// The audit log: acme's events only, as the API gives them to acme.
	evs, err := acme.ListEvents(ctx, client.EventQuery{})
	if err != nil {
		t.Fatal(err)
	}
	b.goTo("#/events", `[data-table="events"]`)
	if n, mine := b.count(`[data-event]`), b.count(`[data-event][data-tenant="acme"]`); n != len(evs) || mine != n {
		t.Fatalf("tenant acme's audit log: %d rows, %d of acme, want the API's %d", n, mine, len(evs))
	}
	b.checkPage("tenant-events")
}
