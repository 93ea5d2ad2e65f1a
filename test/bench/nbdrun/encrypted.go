package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// encryptedKind is the kind of the runs on an encrypted volume (nbd.sh,
// KINDS with encrypted): quiver started with --key-file, serving a volume
// made with --encrypt (XTS-AES-256, internal/crypt), in the same rounds and
// on the same transports as plain quiver (the ref kind), with the same
// random content.
const encryptedKind = "encrypted"

// The goals of issue 35, acceptance 5: what encryption at rest may cost.
const (
	encryptedCPUGoal  = 1.10 // server CPU per request at 4k QD32, encrypted / plain
	encryptedCPUQD    = 32
	encryptedReadGoal = 1000 // MB of 1 MiB reads served per second of server CPU (one core), encrypted
)

// encrypted prints the encrypted volume's runs against plain quiver's in
// the same rows, to w: medians, ratios encrypted/plain and a verdict.
// Nothing without runs of both.
func (rs *runs) encrypted(w io.Writer) {
	cases := rs.casesWith(encryptedKind)
	if len(cases) == 0 {
		return
	}
	med := func(k, kind string, value func(result) float64) float64 {
		var v []float64
		for _, r := range rs.by[k][kind] {
			v = append(v, value(r))
		}
		slices.Sort(v)
		return median(v)
	}
	ratio := func(e, p float64) string {
		if p == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2fx", e/p)
	}
	f := func(k string) []string { return strings.Split(k, "\t") } // transport, rw, bs, qd
	var met, missed []string
	judge := func(what string, ok bool) string {
		if ok {
			met = append(met, what)
			return "met"
		}
		missed = append(missed, what)
		return "MISSED"
	}
	throughput := func(r result) float64 {
		if r.BS == "4k" {
			return r.IOPS
		}
		return r.BW / 1e6
	}
	cpu := func(r result) float64 { return perReq(r.CPU*1e6, r.Requests) }
	mean := func(r result) float64 { return r.Mean }
	p99 := func(r result) float64 { return r.P99 }

	fmt.Fprintf(w, "\nEncrypted (quiver --key-file, a volume made with --encrypt: XTS-AES-256) against plain quiver, issue 35 acceptance 5;\n")
	fmt.Fprintf(w, "medians of the runs, ratios encrypted/plain. Goals: server CPU per request at 4k QD%d at most %.2fx;\n",
		encryptedCPUQD, encryptedCPUGoal)
	fmt.Fprintf(w, "1 MiB reads: at least %d MB per second of server CPU (one core).\n\n", encryptedReadGoal)
	fmt.Fprintf(w, "| case | transport | plain IOPS or MB/s | encrypted | ratio | plain mean µs | encrypted | ratio | plain p99 µs | encrypted | ratio | plain CPU µs/req | encrypted | ratio | added µs | verdict |\n")
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, k := range cases {
		fs := f(k)
		pt, et := med(k, rs.ref, throughput), med(k, encryptedKind, throughput)
		pm, em := med(k, rs.ref, mean), med(k, encryptedKind, mean)
		pp, ep := med(k, rs.ref, p99), med(k, encryptedKind, p99)
		pc, ec := med(k, rs.ref, cpu), med(k, encryptedKind, cpu)
		what := fmt.Sprintf("%s %s QD%s %s", fs[1], fs[2], fs[3], fs[0])
		v := "-"
		if fs[2] == "4k" && fs[3] == fmt.Sprint(encryptedCPUQD) && pc > 0 {
			v = judge(what+" CPU", ec/pc <= encryptedCPUGoal)
		}
		fmt.Fprintf(w, "| %s %s QD%s | %s | %.0f | %.0f | %s | %.1f | %.1f | %s | %.1f | %.1f | %s | %.1f | %.1f | %s | %+.1f | %s |\n",
			fs[1], fs[2], fs[3], fs[0], pt, et, ratio(et, pt), pm, em, ratio(em, pm), pp, ep, ratio(ep, pp),
			pc, ec, ratio(ec, pc), ec-pc, v)
	}
	var reads []string
	for _, k := range cases {
		if fs := f(k); fs[1] == "read" && fs[2] != "4k" {
			reads = append(reads, k)
		}
	}
	if len(reads) > 0 {
		fmt.Fprintf(w, "\nReads above 4k: MB served per second of server CPU (MB/cpu-s: one core's worth; goal for encrypted: at least %d):\n\n", encryptedReadGoal)
		fmt.Fprintf(w, "| case | transport | plain MB/cpu-s | encrypted MB/cpu-s | ratio | verdict |\n|---|---|---|---|---|---|\n")
		perCPU := func(r result) float64 {
			if r.CPU == 0 {
				return 0
			}
			return float64(r.Requests) * float64(bsBytes(r.BS)) / r.CPU / 1e6
		}
		for _, k := range reads {
			fs := f(k)
			p, e := med(k, rs.ref, perCPU), med(k, encryptedKind, perCPU)
			v := judge(fmt.Sprintf("%s %s QD%s %s MB/cpu-s", fs[1], fs[2], fs[3], fs[0]), e >= encryptedReadGoal)
			fmt.Fprintf(w, "| %s %s QD%s | %s | %.0f | %.0f | %s | %s |\n", fs[1], fs[2], fs[3], fs[0], p, e, ratio(e, p), v)
		}
	}
	fmt.Fprintf(w, "\nVerdict (encrypted): ")
	switch {
	case len(missed) == 0 && len(met) > 0:
		fmt.Fprintf(w, "every goal met (%s).\n", strings.Join(met, ", "))
	case len(missed) > 0:
		fmt.Fprintf(w, "%d of %d goals MISSED: %s.\n", len(missed), len(missed)+len(met), strings.Join(missed, ", "))
	default:
		fmt.Fprintf(w, "no case to judge (4k QD%d or reads above 4k, with both kinds).\n", encryptedCPUQD)
	}
}
