package nbdcrash

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// qemuIOPeer is qemu-io, QEMU's block layer over its NBD client (the code a
// VM's disk goes through), fed one command at a time on stdin. It runs with
// -t writeback: qemu-io's default cache mode, writethrough, would add FUA to
// every write. It writes one repeated byte per request (write -P), and FUA
// is write -f.
//
// qemu-io reads its next command only after the previous one finished, and
// then prints its prompt: the output between two prompts belongs to one
// command. (Sending a second command before the prompt is not safe either:
// qemu-io reads stdin through a stdio buffer and may leave it there.)
//
// qemu-io (7.2) prints nothing when a flush fails: flush_f returns the
// error without a message. So after each flush the peer sends a probe, a
// 512-byte read, and reports the flush acknowledged only when the probe
// succeeds. The server dies only by the test's SIGKILL, after which every
// request on the connection fails (QEMU's NBD driver does not reconnect with
// the default reconnect-delay of 0), so a probe that succeeds proves the
// flush before it succeeded. If the flush failed for another reason while
// the probe succeeded, the test would demand more than the server promised
// and fail: never a silent pass.
type qemuIOPeer struct {
	*proc
	idx int

	mu      sync.Mutex // guards the two fields and the writes to stdin
	running *request   // the request whose output comes next
	probing bool       // the output that comes next is the probe's
}

var _ peer = (*qemuIOPeer)(nil)

const (
	qemuIOPrompt = "qemu-io> "
	qemuIOProbe  = "read 0 512\n"
)

// startQemuIO opens uri in qemu-io and returns once it shows its prompt.
func startQemuIO(uri string, idx int, outcomes chan<- outcome) (*qemuIOPeer, error) {
	p, out, err := startProc("qemu-io", "-t", "writeback", "-f", "raw", uri)
	if err != nil {
		return nil, err
	}
	q := &qemuIOPeer{proc: p, idx: idx}
	r := bufio.NewReader(out)
	if first, err := readUntilPrompt(r); err != nil {
		return nil, fmt.Errorf("qemu-io on %s did not start (%q): %w", uri, first, p.abort())
	}
	go q.readOutcomes(r, outcomes)
	return q, nil
}

// readUntilPrompt returns the output up to the next prompt.
func readUntilPrompt(r *bufio.Reader) (string, error) {
	var b []byte
	for {
		c, err := r.ReadByte()
		if err != nil {
			return string(b), err
		}
		b = append(b, c)
		if c == ' ' && bytes.HasSuffix(b, []byte(qemuIOPrompt)) {
			return string(b[:len(b)-len(qemuIOPrompt)]), nil
		}
	}
}

func (q *qemuIOPeer) readOutcomes(r *bufio.Reader, outcomes chan<- outcome) {
	defer close(q.done)
	for {
		text, err := readUntilPrompt(r)
		q.mu.Lock()
		req, probing := q.running, q.probing
		q.running, q.probing = nil, false
		q.mu.Unlock()
		if err != nil {
			if req != nil {
				outcomes <- outcome{peer: q.idx, id: req.id, err: "qemu-io exited"}
			}
			outcomes <- outcome{peer: q.idx, closed: true}
			return
		}
		if req == nil {
			outcomes <- outcome{peer: q.idx, id: -1, err: fmt.Sprintf("qemu-io printed %q with no command running", text)}
			continue
		}
		text = strings.TrimSpace(text)
		ok := false
		switch {
		case probing:
			ok = strings.HasPrefix(text, "read 512/512 bytes at offset 0\n")
			text = "flush unconfirmed: the probe after it failed: " + text
		case req.flush && text == "":
			if err := q.write(req, true, qemuIOProbe); err != nil {
				outcomes <- outcome{peer: q.idx, id: req.id, err: "flush unconfirmed: sending the probe: " + err.Error()}
			}
			continue
		case req.flush:
		default:
			ok = strings.HasPrefix(text, fmt.Sprintf("wrote %d/%d bytes at offset %d\n", len(req.data), len(req.data), req.off))
		}
		if ok {
			outcomes <- outcome{peer: q.idx, id: req.id}
			continue
		}
		if text == "" {
			text = "qemu-io printed nothing"
		}
		outcomes <- outcome{peer: q.idx, id: req.id, err: text}
	}
}

// write sends one command line for req.
func (q *qemuIOPeer) write(req *request, probe bool, line string) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.running != nil {
		return fmt.Errorf("request #%d sent while #%d runs", req.id, q.running.id)
	}
	q.running, q.probing = req, probe
	_, err := q.in.WriteString(line)
	if err == nil {
		err = q.in.Flush()
	}
	if err != nil {
		q.running = nil // the caller reports it
	}
	return err
}

func (q *qemuIOPeer) window() int { return 1 }

// wait reaps qemu-io. Its exit status 1 says that some command failed,
// which every command does once the server is killed; the outcomes already
// told which.
func (q *qemuIOPeer) wait(timeout time.Duration) error {
	err := q.proc.wait(timeout)
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 1 {
		return nil
	}
	return err
}

// send issues write -P or flush. The payload must be one repeated byte.
func (q *qemuIOPeer) send(r request) error {
	if r.flush {
		return q.write(&r, false, "flush\n")
	}
	if len(r.data) == 0 || !bytes.Equal(r.data, bytes.Repeat(r.data[:1], len(r.data))) {
		return errors.New("qemu-io writes one repeated byte (write -P)")
	}
	fua := ""
	if r.fua {
		fua = "-f "
	}
	return q.write(&r, false, fmt.Sprintf("write %s-P %#x %d %d\n", fua, r.data[0], r.off, len(r.data)))
}
