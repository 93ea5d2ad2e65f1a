package nbdcrash

import (
	"bufio"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/testfs"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// The tests drive real NBD clients as child processes and learn, for every
// request, whether the server acknowledged it. A peer is one client on one
// connection: it takes requests from the test and reports each outcome, in
// the order the client saw them, on a channel shared by the peers of one
// workload.

// request is one NBD request for a peer to issue: a FLUSH, a READ of length
// bytes at off into the file path, or a WRITE of data at off, with
// NBD_CMD_FLAG_FUA when fua is set.
type request struct {
	id     int64
	flush  bool
	read   bool
	off    int64
	length int
	path   string
	data   []byte
	fua    bool
}

// outcome is what a peer learnt about one request. err is empty when the
// server acknowledged it. When closed is set the connection is over and the
// peer sends nothing more.
type outcome struct {
	peer   int
	id     int64
	err    string
	closed bool
}

// peer is one NBD client on one connection.
type peer interface {
	// send issues a request; its outcome arrives later on the channel.
	send(r request) error
	// window is how many requests may be in flight at once.
	window() int
	// closeInput tells the client to finish: it waits for the requests in
	// flight, reports them and disconnects.
	closeInput()
	// wait waits until the client has finished, killing it after timeout.
	wait(timeout time.Duration) error
}

// proc is a client's child process, talked to through stdin and stdout.
type proc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	in     *bufio.Writer
	stderr *testserver.LogBuffer
	done   chan struct{} // closed when the reader of its stdout hit EOF

	reaped  sync.Once
	waitErr error
}

func (p *proc) closeInput() { _ = p.stdin.Close() }

// wait reaps the process once its output ended, killing it after timeout,
// and returns how it ended; again on later calls.
func (p *proc) wait(timeout time.Duration) error {
	p.reaped.Do(func() {
		select {
		case <-p.done:
		case <-time.After(timeout):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if err := p.cmd.Wait(); err != nil {
			p.waitErr = fmt.Errorf("%s: %w: %s", filepath.Base(p.cmd.Path), err, strings.TrimSpace(p.stderr.String()))
		}
	})
	return p.waitErr
}

// abort kills a process that failed to start and returns how it ended.
func (p *proc) abort() error {
	_ = p.cmd.Process.Kill()
	close(p.done)
	return p.wait(0)
}

func startProc(name string, args ...string) (*proc, io.Reader, error) {
	p := &proc{cmd: exec.Command(name, args...), stderr: &testserver.LogBuffer{}, done: make(chan struct{})}
	p.cmd.Stderr = p.stderr
	p.cmd.SysProcAttr = dieWithTest()
	var err error
	if p.stdin, err = p.cmd.StdinPipe(); err != nil {
		return nil, nil, err
	}
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := p.cmd.Start(); err != nil {
		return nil, nil, err
	}
	p.in = bufio.NewWriterSize(p.stdin, 64<<10)
	return p, out, nil
}

// dieWithTest makes a child process get SIGKILL when the test process
// dies, so that a test that panics or times out leaves no server or client
// behind. (The signal follows the OS thread that started the child; Go ends
// a thread only when a goroutine locked to it exits, which none here does.)
func dieWithTest() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// Prerequisites.

var (
	pythonOnce sync.Once
	pythonPath string
	pythonErr  error
)

// libnbdPython returns a python3 interpreter that can import the libnbd
// module (package python3-libnbd). nbdsh would be the obvious launcher, but
// it runs whatever python3 comes first in PATH, which need not be the
// system's interpreter that has the module.
func libnbdPython(t *testing.T) string {
	t.Helper()
	pythonOnce.Do(func() {
		var tried []string
		for _, name := range []string{"python3", "/usr/bin/python3"} {
			path, err := exec.LookPath(name)
			if err != nil {
				tried = append(tried, fmt.Sprintf("%s: %v", name, err))
				continue
			}
			out, err := exec.Command(path, "-c", "import nbd").CombinedOutput()
			if err == nil {
				pythonPath = path
				return
			}
			tried = append(tried, fmt.Sprintf("%s: %v: %s", path, err, strings.TrimSpace(string(out))))
		}
		pythonErr = fmt.Errorf("no python3 with the libnbd module (install python3-libnbd): %s", strings.Join(tried, "; "))
	})
	if pythonErr != nil {
		testfs.SkipOrFail(t, "%v", pythonErr)
	}
	return pythonPath
}

func requireTools(t *testing.T, names ...string) {
	t.Helper()
	for _, name := range names {
		testfs.RequireTool(t, name)
	}
}
