package qosbench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testserver"
)

// toolTimeout bounds one run of a peer, so that a hung client fails the
// test with its output instead of the whole run timing out.
const toolTimeout = 2 * time.Minute

// wireRequest is one NBD request qemu sent, from its own trace.
type wireRequest struct {
	typ    string // as qemu names it: read, write, write zeroes, trim, flush, disconnect, ...
	length int64
}

// traceLine matches qemu's nbd_send_request trace event, e.g.
// "nbd_send_request Sending request to server: { .from = 0, .len = 4096,
// .handle = 94..., .flags = 0x1, .type = 1 (write) }".
var traceLine = regexp.MustCompile(`nbd_send_request .*\.len = (\d+),.*\.type = \d+ \(([a-z_ ]+)\)`)

// parseTrace returns the requests of qemu's trace output, in order.
func parseTrace(out string) []wireRequest {
	var reqs []wireRequest
	for _, line := range strings.Split(out, "\n") {
		m := traceLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		n, _ := strconv.ParseInt(m[1], 10, 64)
		reqs = append(reqs, wireRequest{typ: m[2], length: n})
	}
	return reqs
}

// qemuIO runs qemu-io on uri with commands (one -c each), tracing every
// NBD request it sends, and returns its output (trace included) and the
// requests. cache is qemu's cache mode: writethrough (qemu-io's default)
// sends every write with FUA.
func qemuIO(t *testing.T, uri, cache string, commands ...string) (string, []wireRequest) {
	t.Helper()
	args := []string{"--trace", "nbd_send_request", "-f", "raw", "-t", cache}
	for _, c := range commands {
		args = append(args, "-c", c)
	}
	args = append(args, uri)
	ctx, cancel := context.WithTimeout(t.Context(), toolTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "qemu-io", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-io %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	for _, bad := range []string{"failed", "Pattern verification"} {
		if strings.Contains(string(out), bad) {
			t.Fatalf("qemu-io %s:\n%s", strings.Join(args, " "), out)
		}
	}
	return string(out), parseTrace(string(out))
}

// session is a qemu-io reading commands from a pipe, so a test can act
// between two commands (scrape, delete the volume, kill the client).
type session struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *testserver.LogBuffer
	lines chan string // stdout and stderr, line by line
	done  chan struct{}
}

func startSession(t *testing.T, uri, cache string) *session {
	t.Helper()
	s := &session{out: &testserver.LogBuffer{}, lines: make(chan string, 1024), done: make(chan struct{})}
	s.cmd = exec.Command("qemu-io", "--trace", "nbd_send_request", "-f", "raw", "-t", cache, uri)
	var err error
	if s.stdin, err = s.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	s.cmd.Stdout, s.cmd.Stderr = pw, pw
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("qemu-io: %v", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			s.out.Write([]byte(sc.Text() + "\n"))
			select {
			case s.lines <- sc.Text():
			default:
			}
		}
	}()
	go func() {
		_ = s.cmd.Wait()
		pw.Close()
		wg.Wait()
		close(s.done)
	}()
	t.Cleanup(func() {
		_ = s.cmd.Process.Kill()
		<-s.done
	})
	return s
}

// do sends one command and waits for a line of its output that contains
// want.
func (s *session) do(t *testing.T, command, want string) {
	t.Helper()
	if _, err := fmt.Fprintln(s.stdin, command); err != nil {
		t.Fatalf("qemu-io %q: %v\n%s", command, err, s.out.String())
	}
	timeout := time.After(toolTimeout)
	for {
		select {
		case l := <-s.lines:
			if strings.Contains(l, want) {
				return
			}
		case <-s.done:
			t.Fatalf("qemu-io exited during %q, want %q:\n%s", command, want, s.out.String())
		case <-timeout:
			t.Fatalf("qemu-io %q: no %q within %v:\n%s", command, want, toolTimeout, s.out.String())
		}
	}
}

// quit ends qemu-io cleanly (it flushes and disconnects) and returns every
// request it sent.
func (s *session) quit(t *testing.T) []wireRequest {
	t.Helper()
	s.stdin.Close()
	select {
	case <-s.done:
	case <-time.After(toolTimeout):
		t.Fatalf("qemu-io did not exit:\n%s", s.out.String())
	}
	return parseTrace(s.out.String())
}

// kill ends qemu-io with SIGKILL: it neither flushes nor disconnects.
func (s *session) kill(t *testing.T) []wireRequest {
	t.Helper()
	_ = s.cmd.Process.Kill()
	<-s.done
	return parseTrace(s.out.String())
}
