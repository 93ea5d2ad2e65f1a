package nbd

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRecordFuzzSeeds records what real clients (qemu-io, qemu-img,
// nbdinfo) send to the server and writes it as seed corpus under
// testdata/fuzz: the whole stream for FuzzNegotiation, the transmission
// phase (after a mode byte) for FuzzRequests. The server serves the same
// in-memory exports as the fuzz targets, so the recorded requests fit
// their disks. It is a generator, not a test: it runs only with
//
//	QUIVER_RECORD_SEEDS=1 go test -run TestRecordFuzzSeeds ./internal/nbd/
func TestRecordFuzzSeeds(t *testing.T) {
	if os.Getenv("QUIVER_RECORD_SEEDS") == "" {
		t.Skip("set QUIVER_RECORD_SEEDS=1 to record fuzz seeds from qemu-io, qemu-img and nbdinfo")
	}
	srv := NewServer(newMemExports(), Config{Logger: discardLogger()})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer func() { _ = srv.Shutdown(context.Background()) }()
	rec := startRecorder(t, ln.Addr().String())
	url := "nbd://" + rec.addr + "/"

	for _, s := range []struct {
		name string
		argv []string
	}{
		{"qemu-io-rw", []string{"qemu-io", "-f", "raw", "-c", "read -P 0 32k 4k", "-c", "write -P 0xab 4k 4k",
			"-c", "flush", "-c", "write -z 16k 8k", "-c", "discard 24k 4k", "-c", "read -P 0xab 4k 4k",
			"-c", "write -f -P 0x11 40k 512", url + exportData}},
		{"qemu-io-ro", []string{"qemu-io", "-r", "-f", "raw", "-c", "read 0 64k", "-c", "read -P 0 512k 4k", url + exportSnap}},
		{"qemu-img-map", []string{"qemu-img", "map", "--output=json", "-f", "raw", url + exportRoot}},
		{"qemu-img-info", []string{"qemu-img", "info", "-f", "raw", url + exportSnap}},
		{"nbdinfo-list", []string{"nbdinfo", "--list", "nbd://" + rec.addr}},
		{"nbdinfo-map", []string{"nbdinfo", "--map", url + exportRoot}},
		{"nbdinfo-export", []string{"nbdinfo", url + exportSnap}},
	} {
		if _, err := exec.LookPath(s.argv[0]); err != nil {
			t.Fatalf("%s: %v", s.argv[0], err)
		}
		cmd := exec.Command(s.argv[0], s.argv[1:]...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", s.name, err, out)
		}
		t.Logf("%s:\n%s", s.name, out)
		for i, stream := range rec.collect(t) {
			name := s.name
			if i > 0 {
				name += "-" + strconv.Itoa(i)
			}
			writeSeed(t, "FuzzNegotiation", name, stream)
			if mode, tx, ok := splitSession(stream); ok {
				writeSeed(t, "FuzzRequests", name, append([]byte{byte(mode)}, tx...))
			}
		}
	}
}

// recorder is a TCP proxy that keeps what clients send.
type recorder struct {
	addr     string
	mu       sync.Mutex
	sessions [][]byte
	wg       sync.WaitGroup
}

func startRecorder(t *testing.T, target string) *recorder {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	r := &recorder{addr: ln.Addr().String()}
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			r.wg.Add(1)
			go r.proxy(client, target)
		}
	}()
	return r
}

func (r *recorder) proxy(client net.Conn, target string) {
	defer r.wg.Done()
	defer client.Close()
	server, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer server.Close()
	var buf bytes.Buffer
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(client, server)
		_ = client.(*net.TCPConn).CloseWrite()
		close(done)
	}()
	_, _ = io.Copy(io.MultiWriter(server, &buf), client)
	_ = server.(*net.TCPConn).CloseWrite()
	<-done
	r.mu.Lock()
	r.sessions = append(r.sessions, buf.Bytes())
	r.mu.Unlock()
}

// collect waits for the sessions of the last command and returns them.
func (r *recorder) collect(t *testing.T) [][]byte {
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("proxied sessions still open 30 s after the client exited")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.sessions
	r.sessions = nil
	return s
}

// splitSession finds where a recorded client stream enters transmission
// and the fuzzMode that reproduces its negotiation.
func splitSession(b []byte) (fuzzMode, []byte, bool) {
	if len(b) < 4 {
		return 0, nil, false
	}
	var m fuzzMode
	if binary.BigEndian.Uint32(b)&clientFlagNoZeroes != 0 {
		m |= 16
	}
	b = b[4:]
	for len(b) >= 16 && binary.BigEndian.Uint64(b) == 0x49484156454f5054 {
		opt, n := binary.BigEndian.Uint32(b[8:]), binary.BigEndian.Uint32(b[12:])
		if uint64(len(b)-16) < uint64(n) {
			return 0, nil, false
		}
		data := b[16 : 16+n]
		b = b[16+n:]
		switch opt {
		case optStructuredReply:
			m |= 1
		case optSetMetaContext:
			if mr, err := parseMetaQueries(data); err == nil && strings.Contains(strings.Join(mr.queries, ","), metaContextBaseAllocation) {
				m |= 2
			}
		case optGo, optExportName:
			name := string(data)
			if opt == optGo && len(data) >= 4 && uint64(binary.BigEndian.Uint32(data)) <= uint64(len(data)-4) {
				name = string(data[4 : 4+binary.BigEndian.Uint32(data)])
			} else if opt == optExportName {
				m |= 8
			}
			switch name {
			case exportSnap:
				m |= 4
			case exportData:
				m |= 64
			}
			if len(b) == 0 || len(b) >= 8 && binary.BigEndian.Uint64(b) == 0x49484156454f5054 {
				m &^= 4 | 8 | 64 // not the last: more options follow
				continue
			}
			return m, b, true
		}
	}
	return 0, nil, false
}

// writeSeed writes one corpus file in the "go test fuzz v1" format.
func writeSeed(t *testing.T, target, name string, data []byte) {
	dir := filepath.Join("testdata", "fuzz", target)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf("go test fuzz v1\n[]byte(%s)\n", strconv.Quote(string(data)))
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("seed %s/%s: %d bytes", target, name, len(data))
}
