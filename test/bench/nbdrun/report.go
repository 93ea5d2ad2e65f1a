package main

import (
	"bufio"
	"flag"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// rawKind is the kind of the runs on the file itself, without a server.
const rawKind = "raw"

// runs is every run of the results file, by case and kind, in the order
// they first appear.
type runs struct {
	cases []string // result.key()
	kinds []string // servers, without rawKind
	ref   string   // the kind over which ratios are printed
	by    map[string]map[string][]result
}

func report(args []string) error {
	fs := flag.NewFlagSet("report", flag.ExitOnError)
	ref := fs.String("ref", "quiver", "kind whose ratio over each other kind is printed")
	_ = fs.Parse(args)
	if fs.NArg() != 1 {
		return fmt.Errorf("report takes one results file")
	}
	rs, err := load(fs.Arg(0))
	if err != nil {
		return err
	}
	rs.ref = *ref
	rs.table("Server CPU per request (µs, user + system, all threads)", func(r result) (float64, bool) {
		return perReq(r.CPU*1e6, r.Requests), r.Kind != rawKind
	}, "%.1f", false)
	rs.table("Server context switches per request (voluntary + nonvoluntary, all threads)", func(r result) (float64, bool) {
		return perReq(float64(r.Switches), r.Requests), r.Kind != rawKind
	}, "%.2f", false)
	rs.table("Client CPU per request (µs, fio's user + system; on loopback the receiving side of TCP runs partly in the sender's context and partly in the receiver's)", func(r result) (float64, bool) {
		return perReq(r.ClientCPU*1e6, r.Requests), r.Kind != rawKind && r.ClientCPU > 0
	}, "%.1f", false)
	rs.table("Throughput (IOPS for 4k, MB/s for 1m; raw file: psync at QD1, io_uring above)", func(r result) (float64, bool) {
		if r.BS == "4k" {
			return r.IOPS, true
		}
		return r.BW / 1e6, true
	}, "%.0f", true)
	rs.only(func(r result) bool { return r.BS != "4k" }).table("Server CPU per MiB (µs), requests above 4k", func(r result) (float64, bool) {
		mib := float64(r.Requests) * float64(bsBytes(r.BS)) / (1 << 20)
		return r.CPU * 1e6 / mib, r.Kind != rawKind && mib > 0
	}, "%.0f", false)
	qd1 := rs.only(func(r result) bool { return r.QD == 1 })
	qd1.table("Latency mean at QD1 (µs, fio)", func(r result) (float64, bool) {
		return r.Mean, r.Mean > 0
	}, "%.1f", true)
	qd1.table("Latency p50 at QD1 (µs, fio, submission to completion; raw file: psync)", func(r result) (float64, bool) {
		return r.P50, true
	}, "%.1f", true)
	qd1.table("Latency p99 at QD1 (µs)", func(r result) (float64, bool) {
		return r.P99, true
	}, "%.1f", true)
	rs.endpoint(os.Stdout)
	rs.encrypted(os.Stdout)
	return nil
}

func load(path string) (*runs, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rs := &runs{by: map[string]map[string][]result{}}
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		r, err := parseLine(sc.Text())
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		rs.add(r)
	}
	return rs, sc.Err()
}

func (rs *runs) add(r result) {
	k := r.key()
	if r.Kind == rawKind {
		// The file's runs belong to every transport's rows.
		k = strings.SplitN(k, "\t", 2)[1]
	}
	if _, ok := rs.by[k]; !ok {
		rs.by[k] = map[string][]result{}
		if r.Kind != rawKind {
			rs.cases = append(rs.cases, k)
		}
	}
	if r.Kind != rawKind && !slices.Contains(rs.kinds, r.Kind) {
		rs.kinds = append(rs.kinds, r.Kind)
	}
	rs.by[k][r.Kind] = append(rs.by[k][r.Kind], r)
}

// only returns the runs of the cases keep accepts.
func (rs *runs) only(keep func(result) bool) *runs {
	out := &runs{by: map[string]map[string][]result{}, ref: rs.ref}
	rawDone := map[string]bool{}
	for _, k := range rs.cases {
		for _, kind := range rs.kinds {
			for _, r := range rs.by[k][kind] {
				if keep(r) {
					out.add(r)
				}
			}
		}
		if rk := strings.SplitN(k, "\t", 2)[1]; !rawDone[rk] {
			rawDone[rk] = true
			for _, r := range rs.raw(k) {
				if keep(r) {
					out.add(r)
				}
			}
		}
	}
	return out
}

// hasRaw tells whether any case has runs on the file.
func (rs *runs) hasRaw() bool {
	for _, k := range rs.cases {
		if len(rs.raw(k)) > 0 {
			return true
		}
	}
	return false
}

// raw returns the runs on the file for case k (transport, rw, bs, qd).
func (rs *runs) raw(k string) []result {
	return rs.by[strings.SplitN(k, "\t", 2)[1]][rawKind]
}

// table prints one markdown table: per case, each server's median [min-max]
// of value, the raw file's if withRaw, and quiver's median over each other
// server's.
func (rs *runs) table(title string, value func(result) (float64, bool), format string, withRaw bool) {
	if len(rs.cases) == 0 {
		return
	}
	cols := slices.Clone(rs.kinds)
	if withRaw && rs.hasRaw() {
		cols = append(cols, rawKind+" file")
	}
	var ratios []string
	for _, k := range cols {
		if k != rs.ref && slices.Contains(rs.kinds, rs.ref) {
			ratios = append(ratios, rs.ref+"/"+k)
		}
	}
	fmt.Printf("\n%s, median [min-max] of the runs:\n\n", title)
	fmt.Printf("| case | transport | %s |\n", strings.Join(append(slices.Clone(cols), ratios...), " | "))
	fmt.Printf("|---|---|%s\n", strings.Repeat("---|", len(cols)+len(ratios)))
	for _, k := range rs.cases {
		f := strings.Split(k, "\t")
		row := []string{fmt.Sprintf("%s %s QD%s", f[1], f[2], f[3]), f[0]}
		med := map[string]float64{}
		for _, kind := range cols {
			var runs []result
			if kind == rawKind+" file" {
				runs = rs.raw(k)
			} else {
				runs = rs.by[k][kind]
			}
			var v []float64
			for _, r := range runs {
				if x, ok := value(r); ok {
					v = append(v, x)
				}
			}
			if len(v) == 0 {
				row = append(row, "-")
				continue
			}
			slices.Sort(v)
			med[kind] = median(v)
			cell := fmt.Sprintf(format, med[kind])
			if len(v) > 1 {
				cell += " [" + fmt.Sprintf(format, v[0]) + "-" + fmt.Sprintf(format, v[len(v)-1]) + "]"
			}
			row = append(row, cell)
		}
		for _, ratio := range ratios {
			q, ok1 := med[rs.ref]
			o, ok2 := med[strings.TrimPrefix(ratio, rs.ref+"/")]
			if !ok1 || !ok2 || o == 0 {
				row = append(row, "-")
				continue
			}
			row = append(row, fmt.Sprintf("%.2fx", q/o))
		}
		fmt.Printf("| %s |\n", strings.Join(row, " | "))
	}
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// bsBytes parses fio's block sizes of the cases: 4k, 1m.
func bsBytes(bs string) int64 {
	n, err := strconv.ParseInt(strings.TrimRight(bs, "kKmM"), 10, 64)
	if err != nil {
		return 0
	}
	switch strings.ToLower(bs[len(bs)-1:]) {
	case "k":
		return n << 10
	case "m":
		return n << 20
	}
	return n
}

func parseLine(line string) (result, error) {
	f := strings.Split(line, "\t")
	// The 13th field, the client's CPU, came later, and the 14th and
	// 15th (mean latency, the hop's CPU) later still.
	if len(f) < 12 || len(f) > 15 {
		return result{}, fmt.Errorf("%d fields, want 15", len(f))
	}
	var r result
	var errs [11]error
	r.Kind, r.Transport, r.RW, r.BS = f[0], f[1], f[2], f[3]
	r.QD, errs[0] = strconv.Atoi(f[4])
	r.IOPS, errs[1] = strconv.ParseFloat(f[5], 64)
	r.BW, errs[2] = strconv.ParseFloat(f[6], 64)
	r.Requests, errs[3] = strconv.ParseInt(f[7], 10, 64)
	r.CPU, errs[4] = strconv.ParseFloat(f[8], 64)
	r.Switches, errs[5] = strconv.ParseInt(f[9], 10, 64)
	r.P50, errs[6] = strconv.ParseFloat(f[10], 64)
	r.P99, errs[7] = strconv.ParseFloat(f[11], 64)
	if len(f) >= 13 {
		r.ClientCPU, errs[8] = strconv.ParseFloat(f[12], 64)
	}
	if len(f) >= 14 {
		r.Mean, errs[9] = strconv.ParseFloat(f[13], 64)
	}
	if len(f) >= 15 {
		r.HopCPU, errs[10] = strconv.ParseFloat(f[14], 64)
	}
	for _, err := range errs {
		if err != nil {
			return result{}, err
		}
	}
	if math.IsNaN(r.CPU) {
		return result{}, fmt.Errorf("CPU is NaN")
	}
	return r, nil
}
