package nbdcrash

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// libnbdClient is one testdata/nbdpeer.py process: libnbd, the NBD
// project's reference client, with any number of requests in flight and an
// exact report of each reply. It serves one connection at a time and
// outlives the server's restarts, so that the kill test does not start a
// Python interpreter per cycle.
type libnbdClient struct {
	p       *proc
	r       *bufio.Reader
	session *libnbdSession // the latest connection
	exited  bool           // its stdout ended; set by the session that saw it
}

func startLibnbdClient(python string) (*libnbdClient, error) {
	p, out, err := startProc(python, filepath.Join("testdata", "nbdpeer.py"))
	if err != nil {
		return nil, err
	}
	return &libnbdClient{p: p, r: bufio.NewReaderSize(out, 1<<20)}, nil
}

// close ends the process: at the end of its input it finishes the
// connection it serves, if any, and exits.
func (c *libnbdClient) close() error {
	c.p.closeInput()
	if s := c.session; s != nil {
		select {
		case <-s.done:
		case <-time.After(10 * time.Second):
			_ = c.p.cmd.Process.Kill()
			<-s.done
		}
	}
	if !c.exited {
		go func() {
			_, _ = c.r.WriteTo(io.Discard)
			close(c.p.done)
		}()
	}
	return c.p.wait(10 * time.Second)
}

// libnbdSession is one connection of a libnbdClient.
type libnbdSession struct {
	c    *libnbdClient
	idx  int
	max  int
	done chan struct{} // closed when the connection is over
}

var _ peer = (*libnbdSession)(nil)

// connect opens a connection to uri and returns once the handshake is
// done. Outcomes go to outcomes, tagged with idx. The previous connection
// must be over (its wait returned).
func (c *libnbdClient) connect(uri string, idx, window int, outcomes chan<- outcome) (*libnbdSession, error) {
	if c.exited {
		return nil, errors.New("the libnbd client has exited")
	}
	fmt.Fprintf(c.p.in, "C %s\n", uri)
	if err := c.p.in.Flush(); err != nil {
		return nil, fmt.Errorf("libnbd client: %w: %s", err, c.p.stderr.String())
	}
	line, err := c.r.ReadString('\n')
	if err != nil {
		c.exited = true
		close(c.p.done)
		return nil, fmt.Errorf("libnbd client exited: %w", c.p.wait(5*time.Second))
	}
	if line != "R\n" {
		return nil, fmt.Errorf("libnbd client could not connect to %s: %s", uri, strings.TrimSpace(strings.TrimPrefix(line, "X ")))
	}
	s := &libnbdSession{c: c, idx: idx, max: window, done: make(chan struct{})}
	c.session = s
	go s.readOutcomes(outcomes)
	return s, nil
}

func (s *libnbdSession) readOutcomes(outcomes chan<- outcome) {
	defer close(s.done)
	for {
		line, err := s.c.r.ReadString('\n')
		if err != nil {
			s.c.exited = true
			close(s.c.p.done)
			outcomes <- outcome{peer: s.idx, closed: true}
			return
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "Z" {
			outcomes <- outcome{peer: s.idx, closed: true}
			return
		}
		outcomes <- parseLibnbdLine(s.idx, line)
	}
}

// parseLibnbdLine decodes "A <id>" or "E <id> <message>".
func parseLibnbdLine(idx int, line string) outcome {
	bad := outcome{peer: idx, id: -1, err: "unparsable line from the libnbd client: " + line}
	kind, rest, _ := strings.Cut(line, " ")
	idText, tail, _ := strings.Cut(rest, " ")
	id, err := strconv.ParseInt(idText, 10, 64)
	if err != nil {
		return bad
	}
	switch kind {
	case "A":
		if tail != "" {
			return bad
		}
		return outcome{peer: idx, id: id}
	case "E":
		if tail == "" {
			tail = "failed"
		}
		return outcome{peer: idx, id: id, err: tail}
	}
	return bad
}

func (s *libnbdSession) window() int { return s.max }

func (s *libnbdSession) send(r request) error {
	in := s.c.p.in
	switch {
	case r.flush:
		fmt.Fprintf(in, "F %d\n", r.id)
	case r.read:
		fmt.Fprintf(in, "P %d %d %d %s\n", r.id, r.off, r.length, r.path)
	default:
		fua := 0
		if r.fua {
			fua = 1
		}
		fmt.Fprintf(in, "W %d %d %d %s\n", r.id, r.off, fua, hex.EncodeToString(r.data))
	}
	return in.Flush()
}

func (s *libnbdSession) closeInput() {
	_, _ = s.c.p.in.WriteString("D\n")
	_ = s.c.p.in.Flush()
}

// wait waits for the end of the connection. After timeout it kills the
// client, which then cannot connect again, and reports where it was stuck.
func (s *libnbdSession) wait(timeout time.Duration) error {
	select {
	case <-s.done:
	case <-time.After(timeout):
		_ = s.c.p.cmd.Process.Signal(syscall.SIGUSR1)
		time.Sleep(time.Second)
		_ = s.c.p.cmd.Process.Kill()
		<-s.done
		return fmt.Errorf("libnbd client still connected after %v: %w", timeout, s.c.p.wait(5*time.Second))
	}
	if s.c.exited {
		return fmt.Errorf("libnbd client exited mid-connection: %w", s.c.p.wait(5*time.Second))
	}
	return nil
}

// readAll reads a whole export of size bytes on a connection of its own,
// through a file in dir.
func (c *libnbdClient) readAll(uri string, size int, dir string) ([]byte, error) {
	f, err := os.CreateTemp(dir, "read-*.img")
	if err != nil {
		return nil, err
	}
	path := f.Name()
	f.Close()
	defer os.Remove(path)
	outcomes := make(chan outcome, 2)
	s, err := c.connect(uri, 0, 1, outcomes)
	if err != nil {
		return nil, err
	}
	err = s.send(request{id: 1, read: true, length: size, path: path})
	s.closeInput()
	acked := false
	for o := range outcomes {
		if o.closed {
			break
		}
		if o.err != "" {
			err = errors.Join(err, fmt.Errorf("read %s: %s", uri, o.err))
		}
		acked = acked || o.err == ""
	}
	if err := errors.Join(err, s.wait(time.Minute)); err != nil {
		return nil, err
	}
	if !acked {
		return nil, fmt.Errorf("read %s: no reply", uri)
	}
	data, err := os.ReadFile(path)
	if err == nil && len(data) != size {
		err = fmt.Errorf("read %s: got %d bytes, want %d", uri, len(data), size)
	}
	return data, err
}
