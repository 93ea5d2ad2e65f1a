package main

import (
	"bytes"
	"strings"
	"testing"
)

// results builds the runs of results-file lines, as report loads them.
func results(t *testing.T, lines ...string) *runs {
	t.Helper()
	rs := &runs{by: map[string]map[string][]result{}, ref: "quiver"}
	for _, l := range lines {
		r, err := parseLine(l)
		if err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		rs.add(r)
	}
	return rs
}

// TestEndpointVerdict checks the endpoint's section of the report on
// figures whose ratios are known: the ratios are endpoint over direct, of
// the medians of the runs, and each goal is judged on its own.
func TestEndpointVerdict(t *testing.T) {
	// kind transport rw bs qd iops bw requests cpu switches p50 p99 client-cpu mean hop-cpu
	rs := results(t,
		"quiver\ttcp\trandread\t4k\t1\t20000\t0\t100000\t2.0\t100000\t38.0\t100.0\t2.0\t40.0\t0",
		"endpoint\ttcp\trandread\t4k\t1\t18000\t0\t100000\t5.0\t700000\t42.0\t120.0\t2.5\t44.0\t3.0",
		// a second round: the medians of 40 and 60, 44 and 64 are 50 and 54
		"quiver\ttcp\trandread\t4k\t1\t20000\t0\t100000\t2.0\t100000\t38.0\t100.0\t2.0\t60.0\t0",
		"endpoint\ttcp\trandread\t4k\t1\t18000\t0\t100000\t5.0\t700000\t42.0\t120.0\t2.5\t64.0\t3.0",
		"quiver\ttcp\trandwrite\t4k\t32\t60000\t0\t1000000\t10.0\t300000\t500.0\t1500.0\t11.0\t510.0\t0",
		"endpoint\ttcp\trandwrite\t4k\t32\t50000\t0\t1000000\t10.5\t900000\t600.0\t1800.0\t12.0\t610.0\t2.5",
		// a line from before the mean and the hop's CPU were recorded
		"quiver\tunix\tread\t1m\t8\t900\t943718400\t9000\t1.0\t2000\t8000.0\t9000.0\t1.5",
	)
	var out bytes.Buffer
	rs.endpoint(&out)
	got := out.String()
	for _, want := range []string{
		"| randread 4k QD1 | 50.0 | 54.0 | 1.08x | +4.0 | 100.0 | 120.0 | 1.20x | met, MISSED |",
		"| randread 4k QD1 | 20.0 | 50.0 (30.0) | 2.50x | +30.0 | 40.0 | 75.0 | 1.88x | - |",
		"| randwrite 4k QD32 | 10.0 | 10.5 (2.5) | 1.05x | +0.5 | 21.0 | 22.5 | 1.07x | met |",
		"Verdict: 1 of 3 goals MISSED: randread 4k QD1 p99.",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the report lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "read 1m") {
		t.Errorf("the report judges a case without endpoint runs:\n%s", got)
	}
}

// TestEndpointVerdictNeedsBothKinds checks that runs without the endpoint,
// or without the direct runs it is measured against, print nothing.
func TestEndpointVerdictNeedsBothKinds(t *testing.T) {
	for name, line := range map[string]string{
		"direct only":   "quiver\ttcp\trandread\t4k\t1\t20000\t0\t100000\t2.0\t100000\t38.0\t100.0\t2.0\t40.0\t0",
		"endpoint only": "endpoint\ttcp\trandread\t4k\t1\t18000\t0\t100000\t5.0\t700000\t42.0\t120.0\t2.5\t44.0\t3.0",
	} {
		var out bytes.Buffer
		results(t, line).endpoint(&out)
		if out.Len() != 0 {
			t.Errorf("%s: the report has an endpoint section:\n%s", name, out.String())
		}
	}
}

// TestParseLineFields checks the fields of the results file a run appends
// and that lines of every earlier width still load.
func TestParseLineFields(t *testing.T) {
	r, err := parseLine("endpoint\ttcp\trandwrite\t4k\t32\t50000\t0\t1000000\t10.5\t900000\t600.0\t1800.0\t12.0\t610.0\t2.5")
	if err != nil {
		t.Fatal(err)
	}
	if r.Mean != 610 || r.HopCPU != 2.5 || r.ClientCPU != 12 || r.CPU != 10.5 || r.P99 != 1800 || r.QD != 32 {
		t.Errorf("parsed %+v", r)
	}
	for _, n := range []int{12, 13, 14} {
		f := strings.Split("quiver\ttcp\trandread\t4k\t1\t1\t1\t1\t1\t1\t1\t1\t1\t1\t1", "\t")[:n]
		if _, err := parseLine(strings.Join(f, "\t")); err != nil {
			t.Errorf("%d fields: %v", n, err)
		}
	}
	for _, n := range []int{11, 16} {
		f := strings.Split("quiver\ttcp\trandread\t4k\t1\t1\t1\t1\t1\t1\t1\t1\t1\t1\t1\t1", "\t")[:n]
		if _, err := parseLine(strings.Join(f, "\t")); err == nil {
			t.Errorf("%d fields: no error", n)
		}
	}
}
