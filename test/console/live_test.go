package console

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// attr returns attribute name of the first node matching sel ("" when
// there is none).
func (b *browser) attr(sel, name string) string {
	b.t.Helper()
	return eval[string](b, fmt.Sprintf(`((document.querySelector(%q) || {getAttribute: () => ''}).getAttribute(%q)) || ''`, sel, name))
}

// waitFor polls cond every 50 ms until it holds, failing the test with
// what after timeout.
func (b *browser) waitFor(what string, timeout time.Duration, cond func() bool) {
	b.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			b.t.Fatalf("%s: not seen in %v\npage errors: %v", what, timeout, b.pageErrors())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestConsoleQoSChart: fio writes to a volume over quiver's NBD socket with
// no limit; the volume page's live chart shows its IOPS far above 200; an
// IOPS limit of 200 set in the console's QoS dialog reaches the API, and
// the chart's numbers drop to about 200 within seconds, as the API's own
// counters do.
func TestConsoleQoSChart(t *testing.T) {
	if _, err := exec.LookPath("fio"); err != nil {
		testfs.SkipOrFail(t, "fio not found (apt-get install fio)")
	}
	const limit = 200
	srv := startServer(t)
	ctx := context.Background()
	// A small disk: fio's random writes leave little for the server to
	// sync when it stops.
	if _, err := srv.API.CreateVolume(ctx, api.VolumeSpec{Name: "io01", Capacity: 32 << 20,
		Disks: []api.DiskSpec{{Name: "root", Size: 32 << 20}}}); err != nil {
		t.Fatal(err)
	}
	att, err := srv.API.Attach(ctx, "io01", api.AttachmentSpec{Node: "host-a"})
	if err != nil {
		t.Fatal(err)
	}
	fctx, stop := context.WithCancel(ctx)
	fio := exec.CommandContext(fctx, "fio", "--name=console", "--ioengine=nbd", "--uri="+srv.UnixURI("io01/root/"+att.Token),
		"--thread", "--rw=randwrite", "--bs=4k", "--iodepth=16", "--time_based", "--runtime=40s", "--norandommap",
		"--randrepeat=0", "--output-format=terse")
	out := &testserver.LogBuffer{}
	fio.Stdout, fio.Stderr = out, out
	fio.WaitDelay = 5 * time.Second
	if err := fio.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop()
		_ = fio.Wait()
		if t.Failed() {
			t.Logf("fio: %s", out.String())
		}
	})

	b := newBrowser(t, "http://"+srv.APIAddr)
	b.login(adminToken)
	b.goTo("#/volumes/io01", `[data-io="io01"] svg`)
	iops := func() (int, int) { // the newest rate and how many points
		n, _ := strconv.Atoi(b.attr(`[data-io]`, "data-samples"))
		v, _ := strconv.Atoi(b.attr(`[data-io]`, "data-iops"))
		return v, n
	}
	b.waitFor("fio's unlimited writes in the chart (above 3x the limit)", 15*time.Second, func() bool {
		v, n := iops()
		return n >= 2 && v > 3*limit
	})
	before, _ := iops()
	t.Logf("unlimited: %d IOPS in the chart", before)

	b.act("qos", map[string]string{"rwIOPS": strconv.Itoa(limit)})
	b.waitText(`.notice`, "QoS limits changed.")
	v, err := srv.API.GetVolume(ctx, "io01")
	if err != nil {
		t.Fatal(err)
	}
	if v.QoS == nil || v.QoS.RWIOPS != limit {
		t.Fatalf("QoS set in the console: the API has %+v, want rwIOPS %d", v.QoS, limit)
	}

	// Three points in a row within 30% of the limit: the chart follows.
	var seen []int
	defer func() {
		if t.Failed() {
			t.Logf("the chart's points after the limit: %v", seen)
		}
	}()
	run, last := 0, 0
	b.waitFor(fmt.Sprintf("the chart at about %d IOPS", limit), 15*time.Second, func() bool {
		v, n := iops()
		if n == last {
			return false
		}
		last = n
		seen = append(seen, v)
		if v >= limit*7/10 && v <= limit*13/10 {
			run++
		} else {
			run = 0
		}
		return run >= 3
	})
	t.Logf("after the limit, the chart's points: %v", seen)
	b.checkPage("volume-qos")

	// The API's counters, read directly over two seconds, agree.
	s1, err := srv.API.VolumeStats(ctx, "io01")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	s2, err := srv.API.VolumeStats(ctx, "io01")
	if err != nil {
		t.Fatal(err)
	}
	rate := float64(s2.WriteOps-s1.WriteOps+s2.ReadOps-s1.ReadOps) / s2.Time.Sub(s1.Time).Seconds()
	if rate < limit*0.7 || rate > limit*1.3 {
		t.Fatalf("the API's counters: %.0f IOPS under a limit of %d", rate, limit)
	}
	if s2.WriteBytes-s1.WriteBytes != 4096*(s2.WriteOps-s1.WriteOps) {
		t.Fatalf("the API's counters: %d bytes for %d writes of 4 KiB", s2.WriteBytes-s1.WriteBytes, s2.WriteOps-s1.WriteOps)
	}
}

// TestConsoleVolumeEdits changes a volume's labels, adds a disk and grows
// one in the console, each checked against the API; a disk shrunk shows
// the server's own refusal.
func TestConsoleVolumeEdits(t *testing.T) {
	srv := startServer(t)
	ctx := context.Background()
	if _, err := srv.API.CreateVolume(ctx, api.VolumeSpec{Name: "ed01", Capacity: 8 << 30,
		Labels: map[string]string{"app": "old"}, Disks: []api.DiskSpec{{Name: "root", Size: 1 << 30}}}); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, "http://"+srv.APIAddr)
	b.login(adminToken)
	b.goTo("#/volumes/ed01", `[data-disk="root"]`)

	b.act("labels", map[string]string{"labels": "app=web, tier=gold"})
	b.waitText(`.notice`, "Labels changed.")
	v, err := srv.API.GetVolume(ctx, "ed01")
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Labels) != 2 || v.Labels["app"] != "web" || v.Labels["tier"] != "gold" {
		t.Fatalf("labels set in the console: the API has %v", v.Labels)
	}

	b.act("add-disk", map[string]string{"name": "data2", "size": "2"})
	b.waitText(`.notice`, "Disk data2 added.")
	b.run("new disk row", chromedp.WaitVisible(chromedp.CSS(`[data-disk="data2"]`)))

	b.act("grow-root", map[string]string{"size": "3"})
	b.waitText(`.notice`, "Disk root grown to 3.00 GiB.")
	v, err = srv.API.GetVolume(ctx, "ed01")
	if err != nil {
		t.Fatal(err)
	}
	sizes := map[string]int64{}
	for _, d := range v.Disks {
		sizes[d.Name] = d.Size
	}
	if sizes["root"] != 3<<30 || sizes["data2"] != 2<<30 || len(sizes) != 2 {
		t.Fatalf("disks after the console's add and grow: %v", sizes)
	}
	b.waitFor("root's new size in the page", stepTimeout, func() bool {
		return b.attr(`[data-disk="root"] [data-size]`, "data-size") == strconv.Itoa(3<<30)
	})
	b.checkPage("volume-edited")

	// Shrinking: the dialog shows what the server answers to it.
	_, want := srv.API.GrowDisk(ctx, "ed01", "data2", 1<<30)
	if want == nil {
		t.Fatal("the API shrank a disk")
	}
	b.act("grow-data2", map[string]string{"size": "1"})
	if got, wantText := b.text(`form[data-dialog="grow-data2"] .error`), client.Code(want)+": "+want.Error(); got != wantText {
		t.Fatalf("shrink: the console shows %q, the server answers %q", got, wantText)
	}
}

// TestConsoleJobsAndAudit opens the jobs page, then starts a bulk clone
// through the API: the job appears in the open page and its progress
// follows to the end, as the API reports it. The audit log page lists the
// node's events, newest first, as the API does, and one made while it is
// open appears.
func TestConsoleJobsAndAudit(t *testing.T) {
	const clones = 40
	srv := startServer(t)
	ctx := context.Background()
	if _, err := srv.API.CreateVolume(ctx, api.VolumeSpec{Name: "gold", Capacity: 1 << 30,
		Disks: []api.DiskSpec{{Name: "root", Size: 1 << 30}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.API.CreateSnapshot(ctx, "gold", "v1"); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, "http://"+srv.APIAddr)
	b.login(adminToken)
	b.goTo("#/jobs", `section.jobs`)

	names := make([]string, clones)
	for i := range names {
		names[i] = fmt.Sprintf("vdi-%03d", i)
	}
	job, err := srv.API.StartClone(ctx, api.CloneSpec{Source: api.Source{Volume: "gold", Snapshot: "v1"}, Names: names})
	if err != nil {
		t.Fatal(err)
	}
	row := fmt.Sprintf(`[data-job=%q]`, job.ID)
	b.run("the job in the open page", chromedp.WaitVisible(chromedp.CSS(row)))
	b.waitFor("the job done in the page", stepTimeout, func() bool {
		return b.attr(row, "data-state") != api.JobRunning
	})
	j, err := srv.API.GetJob(ctx, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != api.JobSucceeded || j.ItemsDone != clones {
		t.Fatalf("the API's job: %+v", j)
	}
	if got, want := b.attr(row, "data-state")+" "+b.attr(row, "data-done")+"/"+b.attr(row, "data-total"),
		fmt.Sprintf("%s %d/%d", j.State, j.ItemsDone, j.ItemsTotal); got != want {
		t.Fatalf("the job in the page: %s, the API: %s", got, want)
	}
	b.checkPage("jobs")

	// The audit log: the same events as the API, newest first.
	b.goTo("#/events", `[data-table="events"]`)
	evs, err := srv.API.ListEvents(ctx, client.EventQuery{})
	if err != nil {
		t.Fatal(err)
	}
	b.waitFor(fmt.Sprintf("%d events in the page", len(evs)), stepTimeout, func() bool {
		return b.count(`[data-event]`) == len(evs)
	})
	newest := evs[len(evs)-1]
	if got := b.attr(`[data-event]`, "data-event"); got != strconv.FormatInt(newest.Seq, 10) {
		t.Fatalf("first row: event %s, want the newest, %d", got, newest.Seq)
	}
	if n := b.count(`[data-route="POST /v1/clones"][data-status="202"]`); n != 1 {
		t.Fatalf("the bulk clone: %d rows in the audit log, want 1", n)
	}
	b.checkPage("events")
	// A change made while the page is open shows up in it.
	if _, err := srv.API.CreateSnapshot(ctx, "gold", "v2"); err != nil {
		t.Fatal(err)
	}
	b.waitFor("the new snapshot's event", stepTimeout, func() bool {
		return b.attr(`[data-event]`, "data-route") == "POST /v1/volumes/{volume}/snapshots" &&
			strings.Contains(b.text(`[data-event]`), "v2")
	})
}
