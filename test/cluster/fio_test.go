package clustertest

import (
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// fioVerifier runs fio (nbd engine) in segments, one run after the other,
// through one node, until halted: each segment has one job per disk that
// writes its second MiB once in 4 KiB random writes at QD4 and reads
// it back, every block checked with its CRC32C (--verify=crc32c, part of
// it while writing: --verify_backlog). fio's nbd engine does not reconnect
// a dropped connection (libnbd reports the error to fio, which fails the
// job), so the node it goes through must stay up. A segment that fails
// (an I/O error or a bad block) stops the runs.
type fioVerifier struct {
	args []string

	mu      sync.Mutex
	segs    []fioSegment
	running time.Time // start of the segment in progress; zero between
	cmd     *exec.Cmd
	err     error

	stop chan struct{}
	done chan struct{}
}

// fioSegment is one verified fio run.
type fioSegment struct{ start, end time.Time }

func (s fioSegment) String() string {
	return s.start.Format("15:04:05.000") + "-" + s.end.Format("15:04:05.000")
}

// startFioVerifier starts the segments on exports (<volume>/<disk>/<token>)
// through via's NBD address, from the hub namespace.
func startFioVerifier(c *cluster, via *node, exports []string) *fioVerifier {
	args := []string{"netns", "exec", c.net.Hub, "fio", "--ioengine=nbd", "--rw=randwrite", "--bs=4k",
		"--iodepth=4", "--offset=1M", "--size=1M", "--verify=crc32c", "--verify_backlog=64", "--verify_fatal=1",
		"--randrepeat=0", "--minimal",
		// No local-<job>-verify.state files in the working directory (the
		// package's): a segment that fails is reported by its output.
		"--verify_state_save=0"}
	for i, ex := range exports {
		args = append(args, fmt.Sprintf("--name=d%d", i), "--uri=nbd://"+via.ip+":10809/"+ex)
	}
	f := &fioVerifier{args: args, stop: make(chan struct{}), done: make(chan struct{})}
	go f.run()
	return f
}

func (f *fioVerifier) run() {
	defer close(f.done)
	for {
		cmd := exec.Command("ip", f.args...)
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		// fio forks a process per job. Killing only the first leaves the
		// jobs orphaned, waiting on it forever and holding the output
		// pipe, so Wait never returned (a CI run hung 21 minutes in
		// TestFailoverKill): fio runs in a process group of its own, which
		// halt kills whole, and Wait gives up on the pipe 10 s after fio
		// ended.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.WaitDelay = 10 * time.Second
		f.mu.Lock()
		select {
		case <-f.stop: // halted: start no more
			f.mu.Unlock()
			return
		default:
		}
		start := time.Now()
		err := cmd.Start()
		if err == nil {
			f.running, f.cmd = start, cmd
		}
		f.mu.Unlock()
		if err == nil {
			err = cmd.Wait()
		}
		end := time.Now()
		f.mu.Lock()
		f.running, f.cmd = time.Time{}, nil
		halted := false
		select {
		case <-f.stop:
			halted = true
		default:
		}
		switch {
		case err == nil:
			f.segs = append(f.segs, fioSegment{start, end})
		case halted: // killed by halt
			f.mu.Unlock()
			return
		default:
			f.err = fmt.Errorf("fio segment %s: %v:\n%s", fioSegment{start, end}, err, lastLines(out.String(), 15))
		}
		f.mu.Unlock()
		if err != nil {
			return
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitUntil polls cond (under f.mu) until it holds, a segment failed, or
// timeout.
func (f *fioVerifier) waitUntil(what string, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for {
		f.mu.Lock()
		ok, err := cond(), f.err
		f.mu.Unlock()
		switch {
		case err != nil:
			return err
		case ok:
			return nil
		case time.Now().After(deadline):
			return fmt.Errorf("fio: %s: not within %s", what, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitRunning waits until a segment is running.
func (f *fioVerifier) waitRunning(timeout time.Duration) error {
	return f.waitUntil("a segment running", timeout, func() bool { return !f.running.IsZero() })
}

// waitSegmentAfter waits until a segment that started after t has passed.
func (f *fioVerifier) waitSegmentAfter(t time.Time, timeout time.Duration) error {
	return f.waitUntil("a segment started after "+t.Format("15:04:05.000")+" passed", timeout, func() bool {
		return len(f.segs) > 0 && f.segs[len(f.segs)-1].start.After(t)
	})
}

// halt stops the segments, killing the one in progress (it counts
// neither as passed nor as failed), and returns the segments that passed,
// with the error of one that failed.
func (f *fioVerifier) halt() ([]fioSegment, error) {
	f.mu.Lock()
	close(f.stop)
	if f.cmd != nil {
		_ = syscall.Kill(-f.cmd.Process.Pid, syscall.SIGKILL) // the group: fio and its jobs
	}
	f.mu.Unlock()
	<-f.done
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.segs, f.err
}

// spans tells whether a segment ran across t.
func spans(segs []fioSegment, t time.Time) bool {
	for _, s := range segs {
		if s.start.Before(t) && s.end.After(t) {
			return true
		}
	}
	return false
}
