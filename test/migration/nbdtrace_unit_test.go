package migration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckNBDTrace(t *testing.T) {
	const (
		write = "nbd_send_request Sending request to server: { .from = 4096, .len = 4096, .handle = 7, .flags = 0x0, .type = 1 (write) }\n"
		flush = "nbd_send_request Sending request to server: { .from = 0, .len = 0, .handle = 7, .flags = 0x0, .type = 3 (flush) }\n"
		read  = "nbd_send_request Sending request to server: { .from = 0, .len = 512, .handle = 8, .flags = 0x0, .type = 0 (read) }\n"
		disc  = "nbd_send_request Sending request to server: { .from = 0, .len = 0, .handle = 0, .flags = 0x0, .type = 2 (disconnect) }\n"
		ok7   = "nbd_receive_simple_reply Got simple reply: { .error = 0 (success), handle = 7 }\n"
		err7  = "nbd_receive_simple_reply Got simple reply: { .error = 5 (EIO), handle = 7 }\n"
		data8 = "nbd_receive_structured_reply_chunk Got structured reply chunk: { flags = 0x1, type = 1 (data), handle = 8, length = 520 }\n"
		final = "savevm_state_complete_precopy \n"
	)
	cases := []struct {
		name, trace, err string
	}{
		{"good", read + data8 + write + ok7 + flush + ok7 + final + flush + ok7 + disc, ""},
		{"error reply", write + err7, "error reply"},
		{"reply without request", write + ok7 + ok7, "no request outstanding"},
		{"handle reused", write + flush, "reused"},
		{"write after the final state", final + write + ok7, "after the final device state"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "q.trace")
			if err := os.WriteFile(path, []byte(c.trace), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := checkNBDTrace(path)
			if c.err == "" && err != nil || c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)) {
				t.Errorf("checkNBDTrace: %v, want %q", err, c.err)
			}
		})
	}
}

// TestCheckNBDTraceFiles checks the trace logs QUIVER_MIGRATION_TRACES (a
// glob) names, such as those a traced ping-pong run kept.
func TestCheckNBDTraceFiles(t *testing.T) {
	pattern := os.Getenv("QUIVER_MIGRATION_TRACES")
	if pattern == "" {
		t.Skip("set QUIVER_MIGRATION_TRACES to a glob of QEMU trace logs")
	}
	files, err := filepath.Glob(pattern)
	if err != nil || len(files) == 0 {
		t.Fatalf("QUIVER_MIGRATION_TRACES=%q: %d files, %v", pattern, len(files), err)
	}
	var sum nbdTraceSummary
	for _, f := range files {
		s, err := checkNBDTrace(f)
		if err != nil {
			t.Error(err)
		}
		sum.Requests, sum.Replies, sum.Writes, sum.Flushes = sum.Requests+s.Requests, sum.Replies+s.Replies, sum.Writes+s.Writes, sum.Flushes+s.Flushes
	}
	t.Logf("%d trace logs: %d requests (%d writes, %d flushes), %d replies", len(files), sum.Requests, sum.Writes, sum.Flushes, sum.Replies)
}
