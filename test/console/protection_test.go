package console

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/tests3"
	"github.com/quiverstorage/quiver/internal/testserver"
)

const siteToken = "console-test-dr-site-token"

// startProtected runs a server whose API needs adminToken, with one backup
// target, "offsite", on a fresh S3 server (its repository initialised),
// and one DR site, "b", another server.
// The site accepts relationship "db" into its volume "db01-dr".
func startProtected(t *testing.T) (*testserver.Process, *tests3.Server) {
	t.Helper()
	s3 := tests3.Start(t)
	site := testserver.StartT(t, quiverBin, testserver.Options{Token: siteToken})
	if _, err := site.API.DRAccept(context.Background(), api.DRAccept{Relationship: "db", Volume: "db01-dr"}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	keyFile := filepath.Join(dir, "repo.key")
	if out, err := exec.Command(quiverBin, "backup", "key", "generate", keyFile).CombinedOutput(); err != nil {
		t.Fatalf("backup key generate: %v\n%s", err, out)
	}
	backups, _ := json.Marshal(map[string]any{"targets": []map[string]any{{"name": "offsite",
		"endpoint": s3.Config.Endpoint, "bucket": s3.Config.Bucket, "prefix": "quiver", "insecure": true,
		"accessKeyFile": write("access", s3.Config.AccessKey), "secretKeyFile": write("secret", s3.Config.SecretKey),
		"keyFile": keyFile}}})
	dr, _ := json.Marshal(map[string]any{"sites": []map[string]any{{"name": "b", "url": "http://" + site.APIAddr,
		"tokenFile": write("site.token", siteToken+"\n")}}})
	srv := testserver.StartT(t, quiverBin, testserver.Options{Token: adminToken,
		Args: []string{"--backup-config", write("backup.json", string(backups)), "--dr-config", write("dr.json", string(dr))}})
	if _, err := srv.API.InitBackupTarget(context.Background(), "offsite"); err != nil {
		t.Fatal(err)
	}
	return srv, s3
}

// TestConsoleBackupsDRAndCancel: a volume with two backups and a DR
// relationship that shipped a point. Its page lists the backups the API
// lists, newest first, and the relationship's last point as the DR status
// reports it. Then a restore, slowed by the S3 server, runs: a monitor's
// jobs page shows it with no cancel button; the admin's cancels it, and
// the job ends cancelled, in the page and the API, its volume undone.
func TestConsoleBackupsDRAndCancel(t *testing.T) {
	srv, s3 := startProtected(t)
	ctx := context.Background()
	if _, err := srv.API.CreateVolume(ctx, api.VolumeSpec{Name: "db01", Capacity: 64 << 20,
		Disks: []api.DiskSpec{{Name: "root", Size: 64 << 20}}}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		j, err := srv.API.StartBackup(ctx, "db01", api.BackupSpec{})
		if err != nil {
			t.Fatal(err)
		}
		if j, err = srv.API.WaitJob(ctx, j.ID, 50*time.Millisecond, nil); err != nil || j.State != api.JobSucceeded {
			t.Fatalf("backup: %+v, %v", j, err)
		}
	}
	backups, err := srv.API.ListBackups(ctx, "", "db01")
	if err != nil {
		t.Fatal(err)
	}
	if len(backups) != 2 {
		t.Fatalf("the API lists %d backups of db01, want 2", len(backups))
	}
	if _, err := srv.API.SetDRPolicy(ctx, "db01", api.DRPolicy{Site: "b", Relationship: "db", RPO: "1h"}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.API.DRSync(ctx, "db01", api.DRSync{Site: "b", Relationship: "db"}); err != nil {
		t.Fatal(err)
	}
	statuses, err := srv.API.DRStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(statuses) != 1 || statuses[0].LastPoint == "" {
		t.Fatalf("the API's DR status: %+v, want db01's relationship with a point", statuses)
	}

	b := newBrowser(t, "http://"+srv.APIAddr)
	b.login(adminToken)
	b.goTo("#/volumes/db01", `[data-table="backups"]`)
	var ids []string
	for _, bk := range backups {
		ids = append(ids, bk.ID)
	}
	slices.SortFunc(backups, func(x, y api.Backup) int { return y.CreatedAt.Compare(x.CreatedAt) })
	var newestFirst []string
	for _, bk := range backups {
		newestFirst = append(newestFirst, bk.ID)
	}
	if got := eval[[]string](b, `[...document.querySelectorAll('[data-backup]')].map((e) => e.dataset.backup)`); !slices.Equal(got, newestFirst) {
		t.Fatalf("backups in the page: %v, the API's newest first: %v", got, newestFirst)
	}
	row := `[data-dr-status="b/db"]`
	b.run("the DR status", chromedp.WaitVisible(chromedp.CSS(row)))
	if got := b.attr(row, "data-last-point"); got != statuses[0].LastPoint {
		t.Fatalf("the DR row's last point: %q, the API's %q", got, statuses[0].LastPoint)
	}
	b.scrollTo(`[data-backups]`)
	b.checkPage("volume-protection")

	// A restore that takes seconds: every GET of the store waits.
	s3.Delay(4 * time.Second)
	job, err := srv.API.StartRestore(ctx, "", ids[0], api.RestoreSpec{Volume: "db01-restored"})
	if err != nil {
		t.Fatal(err)
	}
	jobRow := `[data-job="` + job.ID + `"]`
	cancel := "cancel-job-" + job.ID

	// A monitor sees the running job, and no button to cancel it.
	mon, err := srv.API.CreateToken(ctx, api.TokenSpec{Role: "monitor", Description: "console test"})
	if err != nil {
		t.Fatal(err)
	}
	eval[bool](b, `(sessionStorage.clear(), true)`)
	b.login(mon.Secret)
	b.goTo("#/jobs", jobRow)
	if got := b.attr(jobRow, "data-state"); got != api.JobRunning {
		t.Fatalf("the restore in the monitor's page: %s, want it running", got)
	}
	if n := b.count(`[data-action]`); n != 0 {
		t.Fatalf("monitor: %d action buttons on the jobs page, want none", n)
	}

	eval[bool](b, `(sessionStorage.clear(), true)`)
	b.login(adminToken)
	b.goTo("#/jobs", jobRow)
	b.act(cancel, nil)
	b.waitText(`.notice`, "Cancelling job "+job.ID+".")
	b.waitFor("the restore cancelled in the page", 20*time.Second, func() bool {
		return b.attr(jobRow, "data-state") != api.JobRunning
	})
	j, err := srv.API.GetJob(ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != api.JobCancelled || b.attr(jobRow, "data-state") != j.State {
		t.Fatalf("the restore: %s in the page, %s in the API (%+v), want %s", b.attr(jobRow, "data-state"), j.State, j.Error, api.JobCancelled)
	}
	if n := b.count(`[data-action="` + cancel + `"]`); n != 0 {
		t.Fatal("a cancelled job keeps its cancel button")
	}
	if _, err := srv.API.GetVolume(ctx, "db01-restored"); client.Code(err) != api.CodeNotFound {
		t.Fatalf("the cancelled restore's volume: %v, want %s", err, api.CodeNotFound)
	}
	if !strings.Contains(b.text(jobRow), "cancelled") {
		t.Fatalf("the cancelled job's row: %q", b.text(jobRow))
	}
	b.checkPage("jobs-cancelled")
}
