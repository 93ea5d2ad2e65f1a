// Command nbdrun is the measuring half of test/bench/nbd.sh, which starts the
// servers and calls it once per run. It measures; it asserts nothing.
//
//	nbdrun run -out results.tsv -kind quiver -transport tcp -pid PID \
//	    -target nbd://127.0.0.1:20811/bench/disk -rw randread -bs 4k -qd 32 -runtime 3
//	nbdrun report [-ref KIND] results.tsv
//
// run drives one fio job, for -runtime seconds or -ios requests (the nbd engine for an nbd URI, psync at queue depth
// 1 and io_uring otherwise for a file) and appends one line to -out: fio's
// IOPS, bytes per second, requests, mean latency and latency percentiles,
// and the server process's CPU time and context switches over the run (-pid may list
// several processes, comma-separated, e.g. the nodes of a cluster: their
// sums). -hop names a process on the path between fio and the server (the
// compute node's endpoint, which serves fio on a unix socket and forwards
// every request to the server over TCP): its CPU time and context switches
// count in the server's, as part of what the path costs, and its CPU time is
// recorded apart as well. CPU time is utime +
// stime of /proc/PID/stat (every thread, exited ones included) read before
// fio starts and after it exits. The client's CPU time is fio's own
// (usr_cpu + sys_cpu of its job): on loopback the kernel runs the receiving
// side of a transfer partly in the sender's system calls and partly in the
// receiver's, so a server can look cheaper by leaving more of that work to
// the client, and the sum of the two is what the machine pays per request.
// Context switches are voluntary +
// nonvoluntary of every /proc/PID/task/*/status, polled every 20 ms while
// fio runs: /proc keeps no total for exited threads, and nbdkit runs each
// connection in threads that exit with it, so what such a thread did in its
// last poll interval (at most 20 ms of a run) is not counted. fio runs
// without ramp_time, so that every request it counts is one the CPU time
// covers; on the raw file with invalidate=0, so that it reads from the page
// cache as the servers do (fio drops the cache before a job by default).
//
// report prints markdown tables of every case: the median of the runs and
// their range (min-max), server CPU per request first, and the ratio of
// the -ref kind (default quiver) over each other kind; with runs of the
// endpoint kind (and of the proxy kind, nbdkit in its place), the endpoint
// against the -ref kind, direct: latency at QD1, CPU per request, ratios
// endpoint/direct and a verdict against issue 30's goals (endpoint.go).
//
// Imports from quiver: nothing.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: nbdrun run|report ...")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "run":
		err = run(os.Args[2:])
	case "report":
		err = report(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want run or report", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nbdrun:", err)
		os.Exit(1)
	}
}

// result is one run: one line of the results file.
type result struct {
	Kind, Transport, RW, BS string
	QD                      int
	IOPS, BW                float64 // requests and bytes per second (fio)
	Requests                int64   // requests fio completed
	CPU                     float64 // server CPU seconds (user + system) over the run; 0 without a server
	ClientCPU               float64 // fio's CPU seconds (user + system) over the run
	Switches                int64   // server context switches over the run
	P50, P99                float64 // total latency percentiles, microseconds (fio)
	Mean                    float64 // mean total latency, microseconds (fio); 0 in results from before it was recorded
	HopCPU                  float64 // the -hop process's CPU seconds over the run, included in CPU; 0 without one
}

func (r result) key() string {
	return fmt.Sprintf("%s\t%s\t%s\t%d", r.Transport, r.RW, r.BS, r.QD)
}

func run(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	var r result
	out := fs.String("out", "", "results file to append to")
	pidList := fs.String("pid", "", "server processes to measure, comma-separated (none: the raw file)")
	hop := fs.Int("hop", 0, "a process between fio and the server (the endpoint): counted in the server's CPU and switches, and recorded apart")
	target := fs.String("target", "", "nbd URI or file")
	runtime := fs.Int("runtime", 10, "seconds")
	size := fs.String("size", "1g", "bytes of the target fio uses")
	ios := fs.Int("ios", 0, "a fixed number of requests instead of -runtime (0: time based)")
	fs.StringVar(&r.Kind, "kind", "", "server name for the report")
	fs.StringVar(&r.Transport, "transport", "", "unix, tcp or file")
	fs.StringVar(&r.RW, "rw", "randread", "fio rw")
	fs.StringVar(&r.BS, "bs", "4k", "fio bs")
	fs.IntVar(&r.QD, "qd", 1, "fio iodepth")
	_ = fs.Parse(args)
	if *out == "" || *target == "" || r.Kind == "" {
		return errors.New("run needs -out, -target and -kind")
	}

	fioArgs := []string{"--name=b", "--rw=" + r.RW, "--bs=" + r.BS, "--iodepth=" + strconv.Itoa(r.QD),
		"--size=" + *size, "--norandommap", "--randrepeat=0", "--lat_percentiles=1", "--output-format=json"}
	if *ios > 0 {
		fioArgs = append(fioArgs, "--number_ios="+strconv.Itoa(*ios))
	} else {
		fioArgs = append(fioArgs, "--runtime="+strconv.Itoa(*runtime), "--time_based")
	}
	switch {
	case strings.HasPrefix(*target, "nbd"):
		fioArgs = append(fioArgs, "--ioengine=nbd", "--uri="+*target)
	case r.QD == 1:
		fioArgs = append(fioArgs, "--ioengine=psync", "--filename="+*target)
	default:
		fioArgs = append(fioArgs, "--ioengine=io_uring", "--filename="+*target)
	}
	if !strings.HasPrefix(*target, "nbd") {
		// fio drops a file's page cache before a job by default: the
		// servers read from the cache, so the reference must too.
		fioArgs = append(fioArgs, "--invalidate=0")
	}

	pids, err := parsePids(*pidList)
	if err != nil {
		return err
	}
	if *hop < 0 || slices.Contains(pids, *hop) {
		return fmt.Errorf("-hop %d: want a process id not in -pid", *hop)
	}
	if *hop > 0 {
		pids = append(pids, *hop)
	}
	var before, hopBefore procSample
	var sws []*switchCounter
	for _, pid := range pids {
		sws = append(sws, newSwitchCounter(pid))
	}
	if before, err = readProcs(pids); err != nil {
		return err
	}
	if *hop > 0 {
		if hopBefore, err = readProc(*hop); err != nil {
			return err
		}
	}
	cmd := exec.Command("fio", fioArgs...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var ferr error
poll:
	for {
		select {
		case ferr = <-done:
			break poll
		case <-tick.C:
			for _, sw := range sws {
				sw.poll()
			}
		}
	}
	if ferr != nil {
		return fmt.Errorf("fio %s: %v: %s", *target, ferr, lastLine(stderr.String()))
	}
	if len(pids) > 0 {
		after, err := readProcs(pids)
		if err != nil {
			return err
		}
		r.CPU = after.cpu - before.cpu
		if *hop > 0 {
			hopAfter, err := readProc(*hop)
			if err != nil {
				return err
			}
			r.HopCPU = hopAfter.cpu - hopBefore.cpu
		}
		for _, sw := range sws {
			sw.poll()
			r.Switches += sw.total()
		}
	}
	if err := parseFio(stdout.Bytes(), &r); err != nil {
		return fmt.Errorf("fio %s: %w", *target, err)
	}
	f, err := os.OpenFile(*out, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(f, "%s\t%s\t%.0f\t%.0f\t%d\t%.4f\t%d\t%.1f\t%.1f\t%.4f\t%.1f\t%.4f\n", r.Kind, r.key(),
		r.IOPS, r.BW, r.Requests, r.CPU, r.Switches, r.P50, r.P99, r.ClientCPU, r.Mean, r.HopCPU)
	if err := f.Close(); err != nil {
		return err
	}
	hopNote := ""
	if *hop > 0 {
		hopNote = fmt.Sprintf(" (%.1f in -hop)", perReq(r.HopCPU*1e6, r.Requests))
	}
	fmt.Fprintf(os.Stderr, "%-14s %-4s %-9s %-2s QD%-2d %8.0f IOPS %6.0f MB/s %7.1f us CPU/req%s %5.2f cs/req mean %.1f p50 %.1f p99 %.1f us, client %.1f us CPU/req\n",
		r.Kind, r.Transport, r.RW, r.BS, r.QD, r.IOPS, r.BW/1e6, perReq(r.CPU*1e6, r.Requests), hopNote,
		perReq(float64(r.Switches), r.Requests), r.Mean, r.P50, r.P99, perReq(r.ClientCPU*1e6, r.Requests))
	return nil
}

func perReq(v float64, n int64) float64 {
	if n == 0 {
		return 0
	}
	return v / float64(n)
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// parseFio reads the figures of fio's JSON output (which may follow
// warnings) into r.
func parseFio(out []byte, r *result) error {
	i := bytes.IndexByte(out, '{')
	if i < 0 {
		return errors.New("no JSON in fio's output")
	}
	type side struct {
		IOBytes  int64   `json:"io_bytes"`
		BW       float64 `json:"bw_bytes"`
		IOPS     float64 `json:"iops"`
		TotalIOs int64   `json:"total_ios"`
		Lat      struct {
			Mean       float64            `json:"mean"`
			Percentile map[string]float64 `json:"percentile"`
		} `json:"lat_ns"`
	}
	var j struct {
		Jobs []struct {
			Read    side    `json:"read"`
			Write   side    `json:"write"`
			Runtime float64 `json:"job_runtime"` // ms
			UsrCPU  float64 `json:"usr_cpu"`     // percent of the runtime
			SysCPU  float64 `json:"sys_cpu"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(out[i:], &j); err != nil {
		return err
	}
	if len(j.Jobs) != 1 {
		return fmt.Errorf("%d jobs in fio's output, want 1", len(j.Jobs))
	}
	s := j.Jobs[0].Read
	if s.IOBytes == 0 {
		s = j.Jobs[0].Write
	}
	if s.TotalIOs == 0 {
		return errors.New("fio did no I/O")
	}
	r.IOPS, r.BW, r.Requests = s.IOPS, s.BW, s.TotalIOs
	job := j.Jobs[0]
	r.ClientCPU = (job.UsrCPU + job.SysCPU) / 100 * job.Runtime / 1e3
	r.P50 = s.Lat.Percentile["50.000000"] / 1e3
	r.P99 = s.Lat.Percentile["99.000000"] / 1e3
	r.Mean = s.Lat.Mean / 1e3
	return nil
}

// parsePids reads -pid: process ids, comma-separated, or none.
func parsePids(s string) ([]int, error) {
	var pids []int
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" || f == "0" {
			continue
		}
		pid, err := strconv.Atoi(f)
		if err != nil || pid < 0 {
			return nil, fmt.Errorf("-pid %q: want process ids, comma-separated", s)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// readProcs sums the CPU time of pids.
func readProcs(pids []int) (procSample, error) {
	var sum procSample
	for _, pid := range pids {
		s, err := readProc(pid)
		if err != nil {
			return procSample{}, err
		}
		sum.cpu += s.cpu
	}
	return sum, nil
}

// procSample is a process's CPU time.
type procSample struct{ cpu float64 } // seconds

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// readProc reads utime + stime of every thread of pid, exited ones
// included (fields 14 and 15 of /proc/PID/stat).
func readProc(pid int) (procSample, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procSample{}, err
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procSample{}, fmt.Errorf("/proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3
	if len(f) < 13 {
		return procSample{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return procSample{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return procSample{cpu: float64(ut+st) / clockTicks}, nil
}

// switchCounter sums the context switches of a process's threads, those
// that start and exit while it watches included (as far as it saw them).
type switchCounter struct {
	pid   int
	first map[int]int64 // per thread: the count when first seen (0 for threads born after the start)
	last  map[int]int64 // per thread: the latest count
	gone  int64         // switches of threads whose id was reused
}

func newSwitchCounter(pid int) *switchCounter {
	s := &switchCounter{pid: pid, first: map[int]int64{}, last: map[int]int64{}}
	if pid != 0 {
		for tid, n := range s.read() {
			s.first[tid], s.last[tid] = n, n
		}
	}
	return s
}

func (s *switchCounter) poll() {
	if s.pid == 0 {
		return
	}
	for tid, n := range s.read() {
		prev, seen := s.last[tid]
		switch {
		case !seen:
			s.first[tid] = 0
		case n < prev: // a new thread with an old id
			s.gone += prev - s.first[tid]
			s.first[tid] = 0
		}
		s.last[tid] = n
	}
}

func (s *switchCounter) total() int64 {
	n := s.gone
	for tid, v := range s.last {
		n += v - s.first[tid]
	}
	return n
}

// read returns voluntary + nonvoluntary context switches of each live
// thread; a thread that exits while it reads is left out.
func (s *switchCounter) read() map[int]int64 {
	dir := fmt.Sprintf("/proc/%d/task", s.pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	m := make(map[int]int64, len(ents))
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		f, err := os.Open(filepath.Join(dir, e.Name(), "status"))
		if err != nil {
			continue
		}
		var n int64
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := sc.Text()
			if v, ok := strings.CutPrefix(line, "voluntary_ctxt_switches:"); ok {
				x, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				n += x
			} else if v, ok := strings.CutPrefix(line, "nonvoluntary_ctxt_switches:"); ok {
				x, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				n += x
			}
		}
		f.Close()
		m[tid] = n
	}
	return m
}
