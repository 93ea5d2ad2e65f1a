// Command sendshape measures what the shape of a large reply costs over TCP
// loopback: one 1 MiB READ reply (a 28-byte structured header and the data)
// sent as one sendmsg, as 256 KiB calls (with and without MSG_MORE on all but
// the last) or as 64 KiB calls, to a receiver that reads like libnbd (the
// header, then the data, with non-blocking recv and poll when nothing is
// buffered). It prints, per MiB, the sending thread's CPU time, the
// receiving thread's, and how often the receiver had to poll (each poll is a
// sleep and a wake-up). The strategies take turns, 200 replies at a time, 30
// times. It measures; it asserts nothing. In this setting one sendmsg per
// reply costs the sender less; in the server, under fio, it moved CPU from
// the client to the server on a loaded machine and saved CPU on both sides
// on an idle one, where it was kept (docs/benchmarks.md, issue 18).
//
//	go run ./test/bench/sendshape
//
// Imports from quiver: nothing.
package main

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"sort"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	header  = 28 // structured reply header + offset
	payload = 1 << 20
	batch   = 200
	rounds  = 30
)

type strategy struct {
	name  string
	chunk int  // most bytes per sendmsg
	more  bool // MSG_MORE on every call but the last
}

var strategies = []strategy{
	{"one sendmsg", 4 << 20, false},
	{"256 KiB calls", 256 << 10, false},
	{"256 KiB + MSG_MORE", 256 << 10, true},
	{"64 KiB calls", 64 << 10, false},
}

// receiver counters, written by the receiving thread.
var polls, replies, recvCPU atomic.Int64

func main() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err)
	}
	go receive(ln.Addr().String())
	c, err := ln.Accept()
	if err != nil {
		fail(err)
	}
	fd := blockingFD(c.(*net.TCPConn), false)
	runtime.LockOSThread()
	reply := make([]byte, header+payload)
	for i := range reply {
		reply[i] = byte(i * 7)
	}
	res := map[string][]float64{}
	for range rounds {
		for _, s := range strategies {
			t0, r0, p0, q0 := threadCPU(), recvCPU.Load(), polls.Load(), replies.Load()
			for range batch {
				send(fd, reply, s)
			}
			for replies.Load() < q0+batch {
				time.Sleep(100 * time.Microsecond)
			}
			res[s.name+"/send"] = append(res[s.name+"/send"], float64(threadCPU()-t0)/1e3/batch)
			res[s.name+"/recv"] = append(res[s.name+"/recv"], float64(recvCPU.Load()-r0)/1e3/batch)
			res[s.name+"/polls"] = append(res[s.name+"/polls"], float64(polls.Load()-p0)/batch)
		}
	}
	fmt.Println("| reply sent as | sender CPU per MiB (µs) | receiver CPU per MiB (µs) | receiver polls per MiB |")
	fmt.Println("|---|---|---|---|")
	for _, s := range strategies {
		fmt.Printf("| %s | %s | %s | %s |\n", s.name,
			spread(res[s.name+"/send"], "%.0f"), spread(res[s.name+"/recv"], "%.0f"), spread(res[s.name+"/polls"], "%.2f"))
	}
}

// send writes reply with sendmsg calls of at most s.chunk bytes.
func send(fd int, reply []byte, s strategy) {
	for len(reply) > 0 {
		n := min(len(reply), s.chunk)
		flags := unix.MSG_NOSIGNAL
		if s.more && n < len(reply) {
			flags |= unix.MSG_MORE
		}
		v := unix.Iovec{Base: &reply[0]}
		v.SetLen(n)
		msg := unix.Msghdr{Iov: &v}
		msg.SetIovlen(1)
		m, _, errno := syscall.Syscall(unix.SYS_SENDMSG, uintptr(fd), uintptr(unsafe.Pointer(&msg)), uintptr(flags))
		if errno != 0 {
			fail(errno)
		}
		reply = reply[m:]
	}
}

// receive reads replies as libnbd does, on a thread of its own.
func receive(addr string) {
	runtime.LockOSThread()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		fail(err)
	}
	fd := blockingFD(c.(*net.TCPConn), true)
	buf := make([]byte, header+payload)
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		for _, part := range [][]byte{buf[:header], buf[header:]} {
			for len(part) > 0 {
				n, err := unix.Read(fd, part)
				if err == unix.EAGAIN {
					polls.Add(1)
					_, _ = unix.Poll(pfd, -1)
					continue
				}
				if err != nil || n == 0 {
					os.Exit(0)
				}
				part = part[n:]
			}
		}
		recvCPU.Store(int64(threadCPU()))
		replies.Add(1)
	}
}

// blockingFD returns a duplicate of c's descriptor, outside Go's poller, in
// blocking mode or not.
func blockingFD(c *net.TCPConn, nonblock bool) int {
	f, err := c.File()
	if err != nil {
		fail(err)
	}
	fd := int(f.Fd())
	if err := unix.SetNonblock(fd, nonblock); err != nil {
		fail(err)
	}
	return fd
}

func threadCPU() time.Duration {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_THREAD, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// spread formats the median and the quartiles of v.
func spread(v []float64, format string) string {
	sort.Float64s(v)
	return fmt.Sprintf(format+" ["+format+"-"+format+"]", v[len(v)/2], v[len(v)/4], v[3*len(v)/4])
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "sendshape:", err)
	os.Exit(1)
}
