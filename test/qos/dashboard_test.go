package qosbench

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// dashboardPath is the Grafana dashboard shipped in deploy/grafana.
var dashboardPath = filepath.Join("..", "..", "deploy", "grafana", "quiver-dashboard.json")

// dashboard is the part of Grafana's dashboard JSON model the test reads.
type dashboard struct {
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // of a collapsed row
}

// Parts of a PromQL expression that are not metric names, removed before
// the names are picked out: string literals, label matchers, range and
// subquery brackets, grouping clauses, dashboard variables.
var (
	promStrings  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
	promMatchers = regexp.MustCompile(`\{[^}]*\}`)
	promRanges   = regexp.MustCompile(`\[[^\]]*\]`)
	promGrouping = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promVars     = regexp.MustCompile(`\$\{?\w+\}?`)
	promIdent    = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promKeywords = []string{"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool",
		"and", "or", "unless", "inf", "nan"}
)

// metricNames returns the metric names a PromQL expression selects.
func metricNames(expr string) []string {
	e := promStrings.ReplaceAllString(expr, `""`)
	e = promMatchers.ReplaceAllString(e, " ")
	e = promRanges.ReplaceAllString(e, " ")
	e = promGrouping.ReplaceAllString(e, " ")
	e = promVars.ReplaceAllString(e, " ")
	var names []string
	for _, m := range promIdent.FindAllStringSubmatch(e, -1) {
		if m[1] != "" { // a function call
			continue
		}
		if slices.Contains(promKeywords, strings.ToLower(m[0])) {
			continue
		}
		names = append(names, m[0])
	}
	return names
}

func TestMetricNamesOfPromQL(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{`sum by (op) (rate(quiver_volume_requests_total{volume="$volume", op!="flush"}[$__rate_interval]))`,
			[]string{"quiver_volume_requests_total"}},
		{`histogram_quantile(0.99, sum by (le) (rate(a_bucket{x=~"a|b"}[5m])))`, []string{"a_bucket"}},
		{`sum(rate(a_sum[1m])) / on (instance) group_left sum(b) or vector(0)`, []string{"a_sum", "b"}},
		{`label_values(quiver_volume_capacity_bytes{instance=~"$instance"}, volume)`,
			[]string{"quiver_volume_capacity_bytes", "volume"}},
	}
	for _, tt := range tests {
		if got := metricNames(tt.expr); !slices.Equal(got, tt.want) {
			t.Errorf("metricNames(%s) = %v, want %v", tt.expr, got, tt.want)
		}
	}
}

// TestDashboardQueriesExposedMetrics decodes the Grafana dashboard and
// checks that every metric its panels and variables query is one a live
// server of the default flags (no --metrics-per-disk) exposes, after a workload that makes every series exist (reads,
// writes, trims, zeroes, flushes, a snapshot, a failed request).
func TestDashboardQueriesExposedMetrics(t *testing.T) {
	testfs.RequireTool(t, "qemu-io")
	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}

	s := startServer(t)
	s.createVolume(t, "vm", &api.QoS{RWIOPS: 100_000}, disk("root", 16*miB))
	qemuIO(t, s.uri("vm", "root"), "writethrough",
		"write -P 1 0 64k", "read 0 64k", "write -z 1M 64k", "discard 2M 64k", "flush")
	if _, err := s.api.CreateSnapshot(t.Context(), "vm", "s1"); err != nil {
		t.Fatal(err)
	}
	s.createVolume(t, "doomed", nil, disk("root", 16*miB))
	q := startSession(t, s.uri("doomed", "root"), "writeback")
	q.do(t, "write 0 4k", "wrote 4096/4096")
	if _, err := s.api.DeleteVolume(t.Context(), "doomed"); err != nil {
		t.Fatal(err)
	}
	q.do(t, "write 0 4k", "write failed")
	q.quit(t)
	exposed := waitIdle(t, s).Names()

	check := func(where, expr string) {
		names := metricNames(expr)
		if len(names) == 0 {
			t.Errorf("%s: no metric in %q", where, expr)
		}
		for _, n := range names {
			if !slices.Contains(exposed, n) {
				t.Errorf("%s: %q queries %s, which the server does not expose", where, expr, n)
			}
		}
	}
	vars := map[string]string{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v.Type
		if v.Type == "query" {
			// label_values(metric, label): the label is not a metric.
			def := strings.TrimSuffix(strings.TrimPrefix(v.Definition, "label_values("), ")")
			metric, _, _ := strings.Cut(def, ",")
			check("variable "+v.Name, metric)
		}
	}
	for _, want := range []string{"datasource", "instance", "volume"} {
		if vars[want] == "" {
			t.Errorf("dashboard has no $%s variable", want)
		}
	}
	ids := map[int]bool{}
	var walk func(ps []panel, row string)
	walk = func(ps []panel, row string) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d is used twice", p.ID)
			}
			ids[p.ID] = true
			if p.Type == "row" {
				row = p.Title
				walk(p.Panels, row)
				continue
			}
			if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q: datasource is not the $datasource variable", p.Title)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				check("panel "+p.Title, tg.Expr)
				if strings.HasPrefix(row, "VM") && !strings.Contains(tg.Expr, `volume="$volume"`) {
					t.Errorf("panel %q of the VM row: %q is not restricted to $volume", p.Title, tg.Expr)
				}
			}
		}
	}
	walk(d.Panels, "")
	if len(ids) < 10 {
		t.Errorf("dashboard has %d panels", len(ids))
	}
}
