package qosbench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testserver"
)

// fioDir is one direction of a fio job's report.
type fioDir struct {
	IOs   int64   `json:"total_ios"`
	Bytes int64   `json:"io_bytes"`
	IOPS  float64 `json:"iops"`
	BW    float64 `json:"bw_bytes"` // bytes per second
}

// fioJob is the part of a job of fio's JSON report the tests read.
type fioJob struct {
	Name  string `json:"jobname"`
	Error int    `json:"error"`
	Read  fioDir `json:"read"`
	Write fioDir `json:"write"`
}

// fioRun is one fio process.
type fioRun struct {
	name, report string
	cmd          *exec.Cmd
	out          *testserver.LogBuffer
	done         chan error
}

// startFio starts fio with args plus a JSON report in dir; wait collects it.
func startFio(t *testing.T, dir, name string, args ...string) *fioRun {
	t.Helper()
	r := &fioRun{name: name, report: filepath.Join(dir, name+".json"), out: &testserver.LogBuffer{}, done: make(chan error, 1)}
	ctx, cancel := context.WithTimeout(t.Context(), toolTimeout)
	args = append([]string{"--name=" + name, "--output-format=json", "--output=" + r.report}, args...)
	r.cmd = exec.CommandContext(ctx, "fio", args...)
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	if err := r.cmd.Start(); err != nil {
		cancel()
		t.Fatalf("fio: %v", err)
	}
	go func() {
		r.done <- r.cmd.Wait()
		cancel()
	}()
	return r
}

// wait waits for fio to end and returns its job, failing the test if fio
// or the job failed.
func (r *fioRun) wait(t *testing.T) fioJob {
	t.Helper()
	err := <-r.done
	data, rerr := os.ReadFile(r.report)
	if err != nil || rerr != nil {
		t.Fatalf("fio %s: %v %v\n%s", strings.Join(r.cmd.Args, " "), err, rerr, r.out.String())
	}
	// fio may print notes before the JSON document.
	if i := strings.IndexByte(string(data), '{'); i > 0 {
		data = data[i:]
	}
	var rep struct {
		Jobs []fioJob `json:"jobs"`
	}
	if err := json.Unmarshal(data, &rep); err != nil || len(rep.Jobs) != 1 {
		t.Fatalf("fio %s report: %v, %d jobs\n%s", r.name, err, len(rep.Jobs), data)
	}
	if j := rep.Jobs[0]; j.Error != 0 {
		t.Fatalf("fio %s: job error %d\n%s", r.name, j.Error, r.out.String())
	}
	return rep.Jobs[0]
}

// nbdArgs are the fio options for a job on an NBD export over quiver's
// unix socket, timed, without fio's random map (the disks are small and
// the runs time based).
func nbdArgs(uri string, runtime time.Duration) []string {
	return []string{"--ioengine=nbd", "--uri=" + uri, "--time_based",
		fmt.Sprintf("--runtime=%dms", runtime.Milliseconds()), "--norandommap", "--randrepeat=0"}
}

// rateSample is the IOPS of both directions over one averaging window of
// fio's per-second log, which ended at end.
type rateSample struct {
	end  time.Time
	iops float64
}

// readIOPSLog parses a log written with --write_iops_log, --log_avg_msec
// and --log_unix_epoch: "msec, value, direction, ..." lines, one per
// direction per window. fio stamps the two directions of a window
// separately (they may differ by a few ms) and now and then leaves a
// window of one direction out, so a read and a write entry are summed into
// one sample only when they end within 50 ms of each other; a window with
// one direction only is dropped.
func readIOPSLog(t *testing.T, path string) []rateSample {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var dirs [2][]rateSample
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Split(line, ",")
		if len(f) < 3 {
			t.Fatalf("%s: bad line %q", path, line)
		}
		ms, err1 := strconv.ParseInt(strings.TrimSpace(f[0]), 10, 64)
		v, err2 := strconv.ParseFloat(strings.TrimSpace(f[1]), 64)
		dir, err3 := strconv.Atoi(strings.TrimSpace(f[2]))
		if err1 != nil || err2 != nil || err3 != nil || dir < 0 || dir > 1 {
			t.Fatalf("%s: bad line %q", path, line)
		}
		dirs[dir] = append(dirs[dir], rateSample{end: time.UnixMilli(ms), iops: v})
	}
	for _, d := range dirs {
		slices.SortFunc(d, func(a, b rateSample) int { return a.end.Compare(b.end) })
	}
	const near = 50 * time.Millisecond
	var out []rateSample
	for rs, ws := dirs[0], dirs[1]; len(rs) > 0 && len(ws) > 0; {
		r, w := rs[0], ws[0]
		switch d := r.end.Sub(w.end); {
		case d < -near:
			rs = rs[1:]
		case d > near:
			ws = ws[1:]
		default:
			out = append(out, rateSample{end: later(r.end, w.end), iops: r.iops + w.iops})
			rs, ws = rs[1:], ws[1:]
		}
	}
	return out
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// perSecond rolls n consecutive samples of 1/n s each into one-second
// rates, one ending at each sample: the rate over the second before it.
// Samples around a dropped window do not make a rate.
func perSecond(samples []rateSample, n int) []rateSample {
	window := time.Second / time.Duration(n)
	var out []rateSample
	for i := n - 1; i < len(samples); i++ {
		run := samples[i-n+1 : i+1]
		if span := run[n-1].end.Sub(run[0].end); span > window*time.Duration(n-1)+window/2 {
			continue
		}
		var sum float64
		for _, s := range run {
			sum += s.iops
		}
		out = append(out, rateSample{end: samples[i].end, iops: sum / float64(n)})
	}
	return out
}

func itoa(n int) string { return strconv.Itoa(n) }

// fioVersion is `fio --version`, for benchmark reports.
func fioVersion(t *testing.T) string {
	out, err := exec.Command("fio", "--version").Output()
	if err != nil {
		t.Fatalf("fio --version: %v", err)
	}
	return strings.TrimSpace(string(out))
}

func numCPU() int { return runtime.NumCPU() }
