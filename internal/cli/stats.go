package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

// Series of the server's /metrics that `volume stats` reads (see
// docs/qos-metrics.md); test/qos checks them against a live server. The
// volume's are always there; its disks' only when the server runs with
// --metrics-per-disk.
const (
	metricVolRequests = "quiver_volume_requests_total"
	metricVolBytes    = "quiver_volume_bytes_total"
	metricVolSeconds  = "quiver_volume_request_seconds_total"
	metricVolInFlight = "quiver_volume_requests_in_flight"
	metricThrottled   = "quiver_qos_throttled_seconds_total"

	metricRequests = "quiver_disk_requests_total"
	metricBytes    = "quiver_disk_bytes_total"
	metricLatSum   = "quiver_disk_request_duration_seconds_sum"
	metricLatCount = "quiver_disk_request_duration_seconds_count"
	metricInFlight = "quiver_disk_requests_in_flight"
)

// writeOps are the operations QoS counts as writes; flush is not limited
// and is left out of the rates.
var writeOps = []string{"write", "trim", "zero"}

// diskStats is the activity of one disk (or of the whole volume) over an
// interval.
type diskStats struct {
	Disk      string  `json:"disk"`
	ReadIOPS  float64 `json:"readIOPS"`
	WriteIOPS float64 `json:"writeIOPS"` // writes, trims and zeroes, as QoS counts them
	ReadMBps  float64 `json:"readMBps"`  // 10^6 bytes per second
	WriteMBps float64 `json:"writeMBps"`
	// Mean latencies, from admission (QoS waits included) to completion;
	// 0 when there was no such request.
	ReadLatency  float64 `json:"readLatencySeconds"`
	WriteLatency float64 `json:"writeLatencySeconds"`
	InFlight     float64 `json:"inFlight"` // at the end of the interval
	// Throttled is the share of the requests' time in quiver spent waiting
	// for QoS tokens, 0 to 1.
	Throttled float64 `json:"throttled"`
}

// volumeStats is one interval of `volume stats`.
type volumeStats struct {
	Volume   string      `json:"volume"`
	Time     time.Time   `json:"time"`
	Interval float64     `json:"intervalSeconds"`
	QoS      *api.QoS    `json:"qos,omitempty"`
	Disks    []diskStats `json:"disks"`
	Total    diskStats   `json:"total"`
}

func (a *app) volumeStatsCommand() *cobra.Command {
	var interval time.Duration
	var count int
	cmd := &cobra.Command{
		Use:   "stats NAME [--interval 1s] [--count N]",
		Short: "Show live I/O rates of a volume's disks, from the server's metrics",
		Long: `Show what the disks of a volume do: every interval, scrape the server's
/metrics and print the volume's read and write IOPS, MB/s (10^6 bytes), mean
latency, requests in flight and the share of the requests' time spent waiting
for QoS tokens (THROTTLED: QoS has one budget per volume, so only the total
shows it). Each disk gets a line of its own when the server exports metrics
per disk (quiver server --metrics-per-disk). On a cluster, through any node,
it reads the metrics of the volume's primary, which serves its disks, and
starts again there after a failover.

Write IOPS count trims and zeroes too, as QoS does; flushes are left out. On a
terminal the table is redrawn in place; otherwise (or with -o json, one object
per line) one is printed per interval. It runs until interrupted, or --count
intervals.`,
		Example: `  quiver volume stats web01
  quiver volume stats web01 --interval 5s --count 12 -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if interval <= 0 {
				return fmt.Errorf("--interval %s: must be positive", interval)
			}
			if count < 0 {
				return fmt.Errorf("--count %d: must be 0 (until interrupted) or more", count)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			return a.watchStats(cmd, c, args[0], interval, count)
		},
	}
	cmd.Flags().DurationVar(&interval, "interval", time.Second, "time between two tables")
	cmd.Flags().IntVar(&count, "count", 0, "stop after this many tables (0: until interrupted)")
	return cmd
}

// watchStats scrapes once, then every interval prints the rates since the
// previous scrape. An interrupt ends it without an error.
func (a *app) watchStats(cmd *cobra.Command, c *client.Client, name string, interval time.Duration, count int) error {
	ctx := cmd.Context()
	w := cmd.OutOrStdout()
	v, err := c.GetVolume(ctx, name)
	if err != nil {
		return err
	}
	src, at, err := a.metricsSource(ctx, c, v)
	if err != nil {
		return err
	}
	prev, err := src.Metrics(ctx)
	if err != nil {
		return err
	}
	prevAt := a.env.Now()
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	drawn := 0 // lines of the table on the terminal, to redraw over
	for i := 0; count == 0 || i < count; i++ {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
		v, err := c.GetVolume(ctx, name)
		if err != nil {
			return interrupted(ctx, err)
		}
		if v.Primary != at {
			// A failover: another node counts the volume's I/O
			// now, with counters of its own. Start again there.
			if src, at, err = a.metricsSource(ctx, c, v); err != nil {
				return interrupted(ctx, err)
			}
			if prev, err = src.Metrics(ctx); err != nil {
				return interrupted(ctx, err)
			}
			prevAt = a.env.Now()
			i--
			continue
		}
		cur, err := src.Metrics(ctx)
		if err != nil {
			return interrupted(ctx, err)
		}
		now := a.env.Now()
		s := computeStats(v, prev, cur, now.Sub(prevAt))
		s.Time = now
		prev, prevAt = cur, now
		switch a.output {
		case outputJSON:
			if err := json.NewEncoder(w).Encode(s); err != nil {
				return err
			}
			continue
		case outputYAML: // a document per sample
			if _, err := fmt.Fprintln(w, "---"); err != nil {
				return err
			}
			if err := printYAML(w, s); err != nil {
				return err
			}
			continue
		case outputName:
			return errNoName
		}
		var buf bytes.Buffer
		if err := statsTable(&buf, s); err != nil {
			return err
		}
		if a.env.Redraw && drawn > 0 {
			// Cursor up over the previous table, then clear to the end.
			fmt.Fprintf(w, "\x1b[%dA\x1b[J", drawn)
		} else if i > 0 {
			fmt.Fprintln(w)
		}
		if _, err := w.Write(buf.Bytes()); err != nil {
			return err
		}
		drawn = bytes.Count(buf.Bytes(), []byte("\n"))
	}
	return nil
}

// metricsSource is the server whose /metrics count the volume's I/O, and
// the primary it is: on a cluster the volume's primary, which serves its
// disks (any other node forwards to it, and counts nothing for the
// volume), reached at the address the node list gives with the same
// credentials; on a single node, or while the volume has no primary, c.
func (a *app) metricsSource(ctx context.Context, c *client.Client, v api.Volume) (*client.Client, string, error) {
	if v.Primary == "" {
		return c, "", nil
	}
	nodes, err := c.ListNodes(ctx)
	if err != nil {
		return nil, "", err
	}
	for _, n := range nodes {
		switch {
		case n.Name != v.Primary:
			continue
		case n.Self:
			return c, n.Name, nil
		case n.Address == "":
			return nil, "", fmt.Errorf("volume %s: its primary %s is down, so no node counts its I/O now; run this again once a copy has taken over",
				v.Name, n.Name)
		}
		scheme := "http://"
		if strings.HasPrefix(serverURL(a.server), "https://") {
			scheme = "https://"
		}
		pc, err := a.clientOf(scheme + n.Address)
		return pc, n.Name, err
	}
	return nil, "", fmt.Errorf("volume %s: its primary %s is not among the cluster's nodes", v.Name, v.Primary)
}

// series are the counters of one operation of one disk in one scrape.
type series struct{ ops, bytes, latSum, latCount float64 }

// interrupted drops err when it only says the command was interrupted,
// which is how `volume stats` normally ends.
func interrupted(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// counters are one disk's series in one scrape.
type counters struct {
	byOp                map[string]*series
	inFlight, throttled float64
}

// diskCounters collects the per-disk series of volume's disks from a
// scrape (none unless the server runs with --metrics-per-disk).
func diskCounters(m client.Metrics, volume string) map[string]*counters {
	out := map[string]*counters{}
	disk := func(l map[string]string) *counters {
		c, ok := out[l["disk"]]
		if !ok {
			c = &counters{byOp: map[string]*series{}}
			out[l["disk"]] = c
		}
		return c
	}
	match := map[string]string{"volume": volume}
	for name, field := range map[string]func(*series) *float64{
		metricRequests: func(s *series) *float64 { return &s.ops },
		metricBytes:    func(s *series) *float64 { return &s.bytes },
		metricLatSum:   func(s *series) *float64 { return &s.latSum },
		metricLatCount: func(s *series) *float64 { return &s.latCount },
	} {
		for _, s := range m.Samples(name, match) {
			if s.Labels["disk"] != "" {
				*field(disk(s.Labels).op(s.Labels["op"])) += s.Value
			}
		}
	}
	for _, s := range m.Samples(metricInFlight, match) {
		if s.Labels["disk"] != "" {
			disk(s.Labels).inFlight += s.Value
		}
	}
	return out
}

// volumeCounters collects the series of the whole volume from a scrape.
func volumeCounters(m client.Metrics, volume string) *counters {
	c := &counters{byOp: map[string]*series{}}
	match := map[string]string{"volume": volume}
	for name, field := range map[string]func(*series) *float64{
		metricVolRequests: func(s *series) *float64 { return &s.ops },
		metricVolBytes:    func(s *series) *float64 { return &s.bytes },
		metricVolSeconds:  func(s *series) *float64 { return &s.latSum },
	} {
		for _, s := range m.Samples(name, match) {
			*field(c.op(s.Labels["op"])) += s.Value
		}
	}
	for _, s := range c.byOp {
		s.latCount = s.ops
	}
	c.inFlight = m.Sum(metricVolInFlight, match)
	c.throttled = m.Sum(metricThrottled, match)
	return c
}

// op returns the series of one operation, made on first use.
func (c *counters) op(name string) *series {
	s, ok := c.byOp[name]
	if !ok {
		s = &series{}
		c.byOp[name] = s
	}
	return s
}

// delta is how much a counter grew; a counter that went down was reset (the
// server restarted) and grew by its new value.
func delta(cur, prev float64) float64 {
	if cur < prev {
		return cur
	}
	return cur - prev
}

// totals are the increases of one disk, or of the whole volume, over an
// interval.
type totals struct {
	readOps, writeOps, readBytes, writeBytes float64
	readLat, readLatN, writeLat, writeLatN   float64
	allLat, throttled, inFlight              float64
}

// diff is what a disk did between two scrapes; prev is nil when the disk
// had no series yet.
func diff(cur, prev *counters) totals {
	if prev == nil {
		prev = &counters{}
	}
	t := totals{throttled: delta(cur.throttled, prev.throttled), inFlight: cur.inFlight}
	for op, c := range cur.byOp {
		p := prev.byOp[op]
		if p == nil {
			p = &series{}
		}
		d := series{ops: delta(c.ops, p.ops), bytes: delta(c.bytes, p.bytes),
			latSum: delta(c.latSum, p.latSum), latCount: delta(c.latCount, p.latCount)}
		t.allLat += d.latSum
		switch {
		case op == "read":
			t.readOps, t.readBytes, t.readLat, t.readLatN = d.ops, d.bytes, d.latSum, d.latCount
		case slices.Contains(writeOps, op):
			t.writeOps += d.ops
			t.writeBytes += d.bytes
			t.writeLat += d.latSum
			t.writeLatN += d.latCount
		}
	}
	return t
}

func (t totals) rates(disk string, dt time.Duration) diskStats {
	sec := dt.Seconds()
	s := diskStats{Disk: disk, InFlight: t.inFlight}
	if sec > 0 {
		s.ReadIOPS, s.WriteIOPS = t.readOps/sec, t.writeOps/sec
		s.ReadMBps, s.WriteMBps = t.readBytes/sec/1e6, t.writeBytes/sec/1e6
	}
	if t.readLatN > 0 {
		s.ReadLatency = t.readLat / t.readLatN
	}
	if t.writeLatN > 0 {
		s.WriteLatency = t.writeLat / t.writeLatN
	}
	if t.allLat > 0 {
		s.Throttled = min(1, t.throttled/t.allLat)
	}
	return s
}

// computeStats turns two scrapes dt apart into the rates of v: the whole
// volume's and, when the server exports metrics per disk, its disks' in
// order, then any other disk the metrics name (one just removed).
func computeStats(v api.Volume, prev, cur client.Metrics, dt time.Duration) volumeStats {
	s := volumeStats{Volume: v.Name, Interval: dt.Seconds(), QoS: v.QoS, Disks: []diskStats{}}
	s.Total = diff(volumeCounters(cur, v.Name), volumeCounters(prev, v.Name)).rates("total", dt)
	before, after := diskCounters(prev, v.Name), diskCounters(cur, v.Name)
	if len(after) == 0 {
		return s
	}
	var names []string
	for _, d := range v.Disks {
		names = append(names, d.Name)
	}
	for _, d := range slices.Sorted(maps.Keys(after)) {
		if !slices.Contains(names, d) {
			names = append(names, d)
		}
	}
	for _, name := range names {
		var t totals
		if c := after[name]; c != nil {
			t = diff(c, before[name])
		}
		s.Disks = append(s.Disks, t.rates(name, dt))
	}
	return s
}

// statsTable prints one interval for people.
func statsTable(w io.Writer, s volumeStats) error {
	fmt.Fprintf(w, "%s   qos %s   %.1fs to %s\n", s.Volume, formatQoS(s.QoS), s.Interval,
		s.Time.Local().Format("15:04:05"))
	t := newTable(w, "DISK", "READ IOPS", "WRITE IOPS", "READ MB/S", "WRITE MB/S",
		"READ LAT", "WRITE LAT", "IN FLIGHT", "THROTTLED")
	for _, d := range append(s.Disks, s.Total) {
		t.row(d.Disk, fmt.Sprintf("%.0f", d.ReadIOPS), fmt.Sprintf("%.0f", d.WriteIOPS),
			fmt.Sprintf("%.1f", d.ReadMBps), fmt.Sprintf("%.1f", d.WriteMBps),
			latency(d.ReadLatency), latency(d.WriteLatency), fmt.Sprintf("%.0f", d.InFlight),
			fmt.Sprintf("%.0f%%", 100*d.Throttled))
	}
	return t.flush()
}

// latency renders a mean latency in a unit that suits it; "-" for none.
func latency(sec float64) string {
	switch {
	case sec <= 0:
		return "-"
	case sec < 1e-3:
		return fmt.Sprintf("%.0fµs", sec*1e6)
	case sec < 1:
		return fmt.Sprintf("%.1fms", sec*1e3)
	default:
		return fmt.Sprintf("%.2fs", sec)
	}
}
