package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// endpointKind is the kind of the runs through the compute node's endpoint
// (test/bench/nbd.sh, KINDS with endpoint): fio on the endpoint's unix
// socket, the endpoint forwarding every request to the quiver server over
// TCP loopback. Its runs are recorded under transport tcp, in the rows of
// quiver's direct TCP runs, the path it is measured against; its CPU is the
// server's and the endpoint's (nbdrun run -hop).
const endpointKind = "endpoint"

// proxyKind is the kind of the runs through nbdkit's nbd plugin in the
// endpoint's place (nbd.sh, KINDS with proxy): one NBD-parsing hop in C,
// the reference for what a hop costs on the machine.
const proxyKind = "proxy"

// The goals of issue 30, acceptance 6: what the endpoint may cost over a
// client connected straight to the primary.
const (
	endpointLatencyGoal = 1.15 // latency at QD1, endpoint / direct
	endpointCPUGoal     = 1.10 // CPU per request at QD32, (server + endpoint) / server
	endpointCPUQD       = 32
)

// endpoint prints the endpoint's runs against the ref kind's (quiver
// direct) in the same rows, to w: the ratios of the medians, endpoint over
// direct, and a verdict against the goals. Nothing without endpoint runs.
func (rs *runs) endpoint(w io.Writer) {
	cases := rs.casesWith(endpointKind)
	if len(cases) == 0 {
		return
	}
	med := func(k, kind string, value func(result) (float64, bool)) (float64, bool) {
		var v []float64
		for _, r := range rs.by[k][kind] {
			if x, ok := value(r); ok {
				v = append(v, x)
			}
		}
		if len(v) == 0 {
			return 0, false
		}
		slices.Sort(v)
		return median(v), true
	}
	ratio := func(e, d float64, okE, okD bool) (float64, string) {
		if !okE || !okD || d == 0 {
			return 0, "-"
		}
		return e / d, fmt.Sprintf("%.2fx", e/d)
	}
	name := func(k string) string {
		f := strings.Split(k, "\t")
		return fmt.Sprintf("%s %s QD%s", f[1], f[2], f[3])
	}
	qd := func(k string) string { return strings.Split(k, "\t")[3] }
	var missed, met []string
	judge := func(what string, x float64, ok bool, goal float64) string {
		switch {
		case !ok:
			return "-"
		case x <= goal:
			met = append(met, what)
			return "met"
		default:
			missed = append(missed, what)
			return "MISSED"
		}
	}

	fmt.Fprintf(w, "\nThe endpoint (fio -> unix socket -> quiver endpoint -> TCP -> quiver server) against quiver direct (fio -> TCP -> quiver server),\n")
	fmt.Fprintf(w, "issue 30 acceptance 6; medians of the runs, ratios endpoint/direct, added: endpoint - direct.\n")
	if slices.Contains(rs.kinds, proxyKind) {
		fmt.Fprintf(w, "The nbdkit proxy (nbdkit's nbd plugin in the endpoint's place) is the reference: one NBD hop in C; its ratios are over direct too.\n")
	}
	fmt.Fprintf(w, "\nLatency at QD1 (µs, fio, submission to completion; goal: at most %.2fx):\n\n", endpointLatencyGoal)
	proxy := slices.Contains(rs.kinds, proxyKind)
	extra, sep := "", ""
	if proxy {
		extra, sep = " nbdkit proxy mean | ratio |", "---|---|"
	}
	fmt.Fprintf(w, "| case | direct mean | endpoint mean | ratio | added | direct p99 | endpoint p99 | ratio |%s verdict (mean, p99) |\n", extra)
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|%s---|\n", sep)
	for _, k := range cases {
		if qd(k) != "1" {
			continue
		}
		mean := func(r result) (float64, bool) { return r.Mean, r.Mean > 0 }
		p99 := func(r result) (float64, bool) { return r.P99, true }
		dm, okDm := med(k, rs.ref, mean)
		em, okEm := med(k, endpointKind, mean)
		dp, okDp := med(k, rs.ref, p99)
		ep, okEp := med(k, endpointKind, p99)
		rm, cm := ratio(em, dm, okEm, okDm)
		rp, cp := ratio(ep, dp, okEp, okDp)
		v1 := judge(name(k)+" mean", rm, cm != "-", endpointLatencyGoal)
		v2 := judge(name(k)+" p99", rp, cp != "-", endpointLatencyGoal)
		px := ""
		if proxy {
			pm, okPm := med(k, proxyKind, mean)
			_, c := ratio(pm, dm, okPm, okDm)
			px = fmt.Sprintf(" %.1f | %s |", pm, c)
		}
		fmt.Fprintf(w, "| %s | %.1f | %.1f | %s | %+.1f | %.1f | %.1f | %s |%s %s, %s |\n", name(k), dm, em, cm, em-dm, dp, ep, cp, px, v1, v2)
	}
	fmt.Fprintf(w, "\nCPU per request (µs, user + system): the quiver processes of the path (direct: the server; endpoint: the server and the\n")
	fmt.Fprintf(w, "endpoint, the endpoint's own share in parentheses), and the machine's (the same plus fio's); goal at QD%d: at most %.2fx:\n\n",
		endpointCPUQD, endpointCPUGoal)
	if proxy {
		extra, sep = " proxy: server + nbdkit | ratio |", "---|---|"
	}
	fmt.Fprintf(w, "| case | direct: server | endpoint: server + endpoint | ratio | added | direct + fio | endpoint + fio | ratio |%s verdict |\n", extra)
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|%s---|\n", sep)
	for _, k := range cases {
		cpu := func(r result) (float64, bool) { return perReq(r.CPU*1e6, r.Requests), true }
		hop := func(r result) (float64, bool) { return perReq(r.HopCPU*1e6, r.Requests), true }
		all := func(r result) (float64, bool) {
			return perReq((r.CPU+r.ClientCPU)*1e6, r.Requests), r.ClientCPU > 0
		}
		dc, okDc := med(k, rs.ref, cpu)
		ec, okEc := med(k, endpointKind, cpu)
		eh, _ := med(k, endpointKind, hop)
		da, okDa := med(k, rs.ref, all)
		ea, okEa := med(k, endpointKind, all)
		rc, cc := ratio(ec, dc, okEc, okDc)
		_, ca := ratio(ea, da, okEa, okDa)
		v := "-"
		if qd(k) == fmt.Sprint(endpointCPUQD) {
			v = judge(name(k)+" CPU", rc, cc != "-", endpointCPUGoal)
		}
		px := ""
		if proxy {
			pc, okPc := med(k, proxyKind, cpu)
			ph, _ := med(k, proxyKind, hop)
			_, c := ratio(pc, dc, okPc, okDc)
			px = fmt.Sprintf(" %.1f (%.1f) | %s |", pc, ph, c)
		}
		fmt.Fprintf(w, "| %s | %.1f | %.1f (%.1f) | %s | %+.1f | %.1f | %.1f | %s |%s %s |\n", name(k), dc, ec, eh, cc, ec-dc, da, ea, ca, px, v)
	}
	fmt.Fprintf(w, "\nVerdict: ")
	switch {
	case len(missed) == 0 && len(met) > 0:
		fmt.Fprintf(w, "every goal met (%s).\n", strings.Join(met, ", "))
	case len(missed) > 0:
		fmt.Fprintf(w, "%d of %d goals MISSED: %s.\n", len(missed), len(missed)+len(met), strings.Join(missed, ", "))
	default:
		fmt.Fprintf(w, "no case to judge (QD1 latency and QD%d CPU need both kinds).\n", endpointCPUQD)
	}
}

// casesWith returns the cases that have runs of kind and of the ref kind,
// in the order they ran: those a side-by-side report can compare.
func (rs *runs) casesWith(kind string) []string {
	var cases []string
	for _, k := range rs.cases {
		if len(rs.by[k][kind]) > 0 && len(rs.by[k][rs.ref]) > 0 {
			cases = append(cases, k)
		}
	}
	return cases
}
