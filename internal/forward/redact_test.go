package forward

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a log sink for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestTokenNeverShown: the client's token is in neither the forwarding
// node's log nor the errors it may pass on to its client, while it finds no
// primary and while it follows one that moved.
func TestTokenNeverShown(t *testing.T) {
	const token = "client-secret-token-0123456789"
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))

	// No primary at all: the open fails after its retries.
	_, err := Open(context.Background(), "vol/disk/"+token,
		func(context.Context) (string, error) { return "", errors.New("primary is down") },
		Options{RetryFor: 300 * time.Millisecond, DialTimeout: 100 * time.Millisecond, Logger: log})
	if err == nil {
		t.Fatal("open with no primary succeeded")
	}
	if strings.Contains(err.Error(), token) {
		t.Errorf("the open's error shows the token: %v", err)
	}

	// A primary that goes away while a request waits: the request is sent
	// again, logged, and finally abandoned.
	s := &store{data: make([]byte, 1<<20)}
	a := startPrimary(t, s)
	addr := a.addr
	// The test's primary serves "vol/disk" without tokens: Name drops it.
	d, err := Open(context.Background(), "vol/disk/"+token, func(context.Context) (string, error) { return addr, nil },
		Options{RequestTimeout: time.Second, RetryFor: time.Second, DialTimeout: 200 * time.Millisecond, Logger: log,
			Name: func(string) string { return "vol/disk" }})
	if err != nil {
		t.Fatal(err)
	}
	a.stop()
	if err := d.WriteAt(make([]byte, 512), 0, false); err == nil || strings.Contains(err.Error(), token) {
		t.Errorf("write with the primary gone: %v; want an error without the token", err)
	}
	d.Close()
	if strings.Contains(logs.String(), token) {
		t.Errorf("the log shows the token:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "vol/disk/<token>") {
		t.Errorf("the log never names the export: the test saw nothing\n%s", logs.String())
	}
}
