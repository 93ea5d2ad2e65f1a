package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/nbdclient"
	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// TestBenchDR is issue 34's acceptance 6 (make bench-dr): DR's delta
// shipping throughput, and the lowest RPO it holds, while a 3-disk VM
// writes at 10, 50 and 100 MB/s (QUIVER_BENCH_DR_RATES). Two servers on
// loopback, each with its pool on a loop-mounted XFS of its own; the VM's
// writer is 64 KiB random writes of fresh random data over NBD at the rate,
// spread over three 1 GiB disks. For each rate, for QUIVER_BENCH_DR_SECONDS
// (default 60), cycles run back to back, the shortest schedule there is:
// the lag just before a point commits is the time since the previous
// point was taken, and the largest such lag is the lowest RPO that rate
// holds. Prints, never asserts.
func TestBenchDR(t *testing.T) {
	requireBench(t)
	testfs.RequireRoot(t)
	seconds := envInt(t, "QUIVER_BENCH_DR_SECONDS", 60)
	rates := []int64{10, 50, 100}
	if s := os.Getenv("QUIVER_BENCH_DR_RATES"); s != "" {
		rates = nil
		for _, f := range strings.Split(s, ",") {
			var r int64
			if _, err := fmt.Sscan(f, &r); err != nil || r <= 0 {
				t.Fatalf("QUIVER_BENCH_DR_RATES=%q: want MB/s, comma-separated", s)
			}
			rates = append(rates, r)
		}
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "quiver")
	if err := testserver.Build(bin, false); err != nil {
		t.Fatal(err)
	}
	const token = "bench-dr-site-b-token-0123456789abcdef"
	tokFile := filepath.Join(dir, "b.token")
	if err := os.WriteFile(tokFile, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	b := testserver.StartT(t, bin, testserver.Options{Pool: filepath.Join(testfs.MountXFS(t, 16*gib), "pool"), Token: token, LogLevel: "warn"})
	cfg, _ := json.Marshal(map[string]any{"sites": []map[string]any{{"name": "b", "url": "http://" + b.APIAddr, "tokenFile": tokFile}}})
	cfgFile := filepath.Join(dir, "dr.json")
	if err := os.WriteFile(cfgFile, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	a := testserver.StartT(t, bin, testserver.Options{Pool: filepath.Join(testfs.MountXFS(t, 16*gib), "pool"), NBDTCP: true,
		LogLevel: "warn", Args: []string{"--dr-config", cfgFile}})
	ctx := context.Background()
	const diskSize = gib
	if _, err := a.API.CreateVolume(ctx, api.VolumeSpec{Name: "vm", Capacity: 3 * diskSize,
		Disks: []api.DiskSpec{{Name: "d0", Size: diskSize}, {Name: "d1", Size: diskSize}, {Name: "d2", Size: diskSize}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.API.DRAccept(ctx, api.DRAccept{Relationship: "db", Volume: "vm-dr"}); err != nil {
		t.Fatal(err)
	}
	var conns [3]*nbdclient.Conn
	for d := range conns {
		c, err := nbdclient.Dial(ctx, a.NBDAddr, fmt.Sprintf("vm/d%d", d), nbdclient.Options{Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns[d] = c
	}
	// A cycle's call lasts as long as the cycle: no short client timeout.
	api2, err := client.New("http://"+a.APIAddr, client.WithHTTPClient(&http.Client{Timeout: 30 * time.Minute}))
	if err != nil {
		t.Fatal(err)
	}
	cycle := func() (api.DRCycle, time.Time, time.Time) {
		start := time.Now()
		st, err := api2.DRSync(ctx, "vm", api.DRSync{Site: "b", Relationship: "db"})
		if err != nil {
			t.Fatal(err)
		}
		return st, start, time.Now()
	}
	first, s0, e0 := cycle() // the first point, in full (the disks are empty: all zeroes)
	t.Logf("first point: %d MiB changed, %d MiB written, in %v", first.Changed>>20, first.Sent>>20, e0.Sub(s0).Round(time.Millisecond))

	random := make([]byte, 64<<20)
	fillRandom(rand.New(rand.NewPCG(7, 7)), random)
	r := &report{}
	r.add("writes (MB/s asked)", "written (MB/s)", "cycles", "cycle, median [max]", "shipped a cycle, median", "delta shipping (MB/s)", "lowest RPO held")
	for _, rate := range rates {
		_, prevStart, _ := cycle() // the base of this rate's cycles
		var stop atomic.Bool
		var wrote atomic.Int64
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(rate), 1))
			began := time.Now()
			for !stop.Load() {
				// A piece of the random pool at a random place: data the
				// disk did not hold there.
				at := rng.IntN(len(random)-64<<10) &^ 4095
				buf := random[at : at+64<<10]
				d := rng.IntN(3)
				off := rng.Int64N(diskSize/int64(len(buf))) * int64(len(buf))
				if err := conns[d].WriteAt(buf, off, false); err != nil {
					t.Error(err)
					return
				}
				n := wrote.Add(int64(len(buf)))
				// Pace: n bytes at rate MB/s.
				if ahead := time.Duration(float64(n)/float64(rate*1e6)*float64(time.Second)) - time.Since(began); ahead > 0 {
					time.Sleep(ahead)
				}
			}
		}()
		var durs []time.Duration
		var shipped []int64
		var totalSent int64
		var totalTime, worstLag time.Duration
		began := time.Now()
		wroteBefore := wrote.Load()
		for time.Since(began) < time.Duration(seconds)*time.Second {
			st, start, end := cycle()
			durs = append(durs, end.Sub(start))
			shipped = append(shipped, st.Sent+st.Zeroed)
			totalSent += st.Sent + st.Zeroed
			totalTime += end.Sub(start)
			worstLag = max(worstLag, end.Sub(prevStart))
			prevStart = start
		}
		elapsed := time.Since(began)
		stop.Store(true)
		wg.Wait()
		slices.Sort(durs)
		sortedShipped := slices.Clone(shipped)
		slices.Sort(sortedShipped)
		r.add(fmt.Sprint(rate), fmt.Sprintf("%.1f", float64(wrote.Load()-wroteBefore)/1e6/elapsed.Seconds()), fmt.Sprint(len(durs)),
			fmt.Sprintf("%s [%s]", durs[len(durs)/2].Round(time.Millisecond), durs[len(durs)-1].Round(time.Millisecond)),
			fmt.Sprintf("%.1f MiB", float64(sortedShipped[len(sortedShipped)/2])/float64(mib)),
			fmt.Sprintf("%.0f", float64(totalSent)/1e6/totalTime.Seconds()),
			worstLag.Round(100*time.Millisecond).String())
	}
	r.print(os.Stdout, fmt.Sprintf("DR (issue 34, acceptance 6): a 3-disk VM of 3 GiB writing 64 KiB random writes at each rate, "+
		"cycles back to back for %d s, two servers on loopback, pools on loop-mounted XFS", seconds))
}
