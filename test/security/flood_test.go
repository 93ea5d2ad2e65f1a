package security

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// floodEnv makes the test binary a flooder: "addr first n per" opens per
// connections from each of n loopback addresses from 127.0.0.<first>,
// holds them (sending nothing), prints "ready <held> <failed>" and waits for
// its stdin to close.
const floodEnv = "QUIVER_SECURITY_FLOOD"

// flood is a flooder's main.
func flood(spec string) int {
	var addr string
	var first, n, per int
	if _, err := fmt.Sscan(spec, &addr, &first, &n, &per); err != nil {
		fmt.Fprintln(os.Stderr, "flood spec:", err)
		return 2
	}
	var lim syscall.Rlimit
	_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	lim.Cur = lim.Max
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	var mu sync.Mutex
	var held []net.Conn
	var failed atomic.Int64
	var wg sync.WaitGroup
	for _, src := range addrs(first, n) {
		for range 50 {
			wg.Go(func() {
				for range per / 50 {
					c, err := dialFrom(src, addr, 2*time.Second)
					if err != nil {
						failed.Add(1)
						continue
					}
					mu.Lock()
					held = append(held, c)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	fmt.Printf("ready %d %d\n", len(held), failed.Load())
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // until the test closes stdin
	return 0
}

// flooder is a running flooder process.
type flooder struct {
	cmd   *exec.Cmd
	stdin interface{ Close() error }
	out   *bufio.Reader
	spec  string
}

func startFlooder(t *testing.T, addr string, first, n, per int) *flooder {
	t.Helper()
	f := &flooder{spec: fmt.Sprintf("%s %d %d %d", addr, first, n, per)}
	f.cmd = exec.Command(os.Args[0], "-test.run=^$")
	f.cmd.Env = append(os.Environ(), floodEnv+"="+f.spec)
	f.cmd.Stderr = os.Stderr
	f.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	in, err := f.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := f.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	f.stdin, f.out = in, bufio.NewReader(out)
	if err := f.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.stop)
	return f
}

// wait returns once the flooder has made all its connections.
func (f *flooder) wait(t *testing.T) {
	line, err := f.out.ReadString('\n')
	if err != nil {
		t.Errorf("flooder %s: %v", f.spec, err)
		return
	}
	fields := strings.Fields(line)
	if len(fields) == 3 {
		heldN, _ := strconv.Atoi(fields[1])
		t.Logf("flooder %s: %d connections made, %d dials failed", f.spec, heldN, atoiOr(fields[2]))
	}
}

func atoiOr(s string) int { n, _ := strconv.Atoi(s); return n }

// stop closes the flooder's connections (it exits) and reaps it.
func (f *flooder) stop() {
	if f.cmd.ProcessState != nil {
		return
	}
	_ = f.stdin.Close()
	_ = f.cmd.Wait()
}
