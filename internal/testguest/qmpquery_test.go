package testguest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// fakeQMP serves QMP on a unix socket at path as QEMU does: the greeting,
// then one reply per command, from replies (a command's "return" value).
// Quit is answered, then onQuit runs.
func fakeQMP(t *testing.T, path string, replies map[string]string, onQuit func()) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		conn.Write([]byte(`{"QMP": {"version": {}, "capabilities": []}}` + "\n"))
		r := bufio.NewScanner(conn)
		for r.Scan() {
			var req struct {
				Execute string `json:"execute"`
				ID      string `json:"id"`
			}
			if json.Unmarshal(r.Bytes(), &req) != nil {
				return
			}
			ret, ok := replies[req.Execute]
			switch {
			case req.Execute == "qmp_capabilities" || req.Execute == "quit":
				ret = "{}"
			case !ok:
				conn.Write([]byte(`{"error": {"class": "CommandNotFound", "desc": "no"}, "id": "` + req.ID + `"}` + "\n"))
				continue
			}
			var b bytes.Buffer // one line, as QEMU writes it
			if err := json.Compact(&b, []byte(`{"return": `+ret+`, "id": "`+req.ID+`"}`)); err != nil {
				panic(err)
			}
			conn.Write(append(b.Bytes(), '\n'))
			if req.Execute == "quit" && onQuit != nil {
				onQuit()
			}
		}
	}()
}

// TestQMPQueries: the run state, and io-status and counters per node name,
// decoded from replies shaped as QEMU 7.2's; entries without a node name
// are left out.
func TestQMPQueries(t *testing.T) {
	sock := filepath.Join(ShortDir(t, "qmp"), "qmp")
	fakeQMP(t, sock, map[string]string{
		"query-status": `{"status": "io-error", "singlestep": false, "running": false}`,
		"query-block": `[{"device": "", "qdev": "/machine/peripheral/vda/virtio-backend", "io-status": "nospace",
			"inserted": {"node-name": "disk-vda", "drv": "nbd"}}, {"device": "cd0", "io-status": "ok"}]`,
		"query-blockstats": `[{"device": "", "node-name": "disk-vda", "stats": {"wr_operations": 3, "wr_bytes": 12288,
			"failed_wr_operations": 1, "flush_operations": 2, "rd_operations": 5, "failed_rd_operations": 4}},
			{"device": "", "stats": {"wr_operations": 9}}]`,
	}, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	q, err := DialQMP(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if st, err := q.Status(ctx); err != nil || st != "io-error" {
		t.Errorf("Status = %q, %v; want io-error", st, err)
	}
	if io, err := q.IOStatus(ctx); err != nil || len(io) != 1 || io["disk-vda"] != "nospace" {
		t.Errorf("IOStatus = %v, %v; want disk-vda nospace alone", io, err)
	}
	want := BlockStats{WrOperations: 3, WrBytes: 12288, FailedWrOperations: 1, FlushOperations: 2, RdOperations: 5, FailedRdOperations: 4}
	stats, err := q.BlockStats(ctx)
	if err != nil || len(stats) != 1 || stats["disk-vda"] != want {
		t.Errorf("BlockStats = %+v, %v; want disk-vda %+v alone", stats, err, want)
	}
	if n := stats["disk-vda"].Failed(); n != 5 {
		t.Errorf("Failed = %d, want 5", n)
	}
}

// TestVMQuit: a shell stands in for QEMU and exits with status 0 when the
// fake QMP server gets quit; Quit is content, and Shutdown afterwards is a
// no-op. A VM that exits with status 1 after quit fails Quit.
func TestVMQuit(t *testing.T) {
	for _, tc := range []struct {
		status string
		ok     bool
	}{{"0", true}, {"1", false}} {
		dir := ShortDir(t, "qmp")
		sock, quit := filepath.Join(dir, "qmp"), filepath.Join(dir, "quit")
		fakeQMP(t, sock, nil, func() { os.WriteFile(quit, nil, 0o644) })
		cmd := exec.Command("sh", "-c", `while [ ! -e "$0" ]; do sleep 0.05; done; exit $1`, quit, tc.status)
		v, err := StartVM(cmd, filepath.Join(dir, "console"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(v.Kill)
		if err := v.DialQMP(t.Context(), sock); err != nil {
			t.Fatal(err)
		}
		err = v.Quit(t.Context())
		if (err == nil) != tc.ok {
			t.Errorf("exit status %s after quit: Quit = %v", tc.status, err)
		}
		if v.Running() {
			t.Errorf("exit status %s: still running after Quit", tc.status)
		}
		v.Shutdown()
	}
}

// TestVMShutdown: QEMU that does not answer QMP's quit (nothing serves the
// socket after the greeting) is killed; without QMP at once.
func TestVMShutdown(t *testing.T) {
	v, err := StartVM(exec.Command("sleep", "60"), filepath.Join(t.TempDir(), "console"))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	v.Shutdown()
	if v.Running() {
		t.Fatal("running after Shutdown")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Shutdown without QMP took %v", d)
	}
	if err := v.Quit(t.Context()); err == nil {
		t.Error("Quit without QMP succeeded")
	}
}
