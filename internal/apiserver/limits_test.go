package apiserver

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestBodyTimeout: a client that trickles its body is answered 400 once
// BodyTimeout has passed, and nothing is created; a request whose body came
// in time is served, however long the operation then takes.
func TestBodyTimeout(t *testing.T) {
	s, p := newTestAPI(t, "")
	s.BodyTimeout = 300 * time.Millisecond
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)

	body := `{"name":"trickled","capacity":1048576}`
	nc, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fmt.Fprintf(nc, "POST /v1/volumes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(body))
	stop := make(chan struct{})
	go func() { // one byte every 100 ms: 3.8 s for the whole body
		for i := range len(body) {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := nc.Write([]byte{body[i]}); err != nil {
				return
			}
		}
	}()
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
	close(stop)
	if err != nil {
		t.Fatalf("no answer to a trickled body: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("trickled body: status %d, want 400", resp.StatusCode)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("trickled body answered after %v, want about the body timeout", took)
	}
	if vols := p.List(nil); len(vols) != 0 {
		t.Errorf("volumes after a refused body: %v", vols)
	}

	c := &apiClient{t: t, base: srv.URL}
	if status, b := c.do("POST", "/v1/volumes", map[string]any{"name": "ontime", "capacity": 1 << 20}); status != http.StatusCreated {
		t.Fatalf("body in time: status %d: %s", status, b)
	}
}

// TestLocalSkipsToken: the handler for the unix socket serves without the
// token, the TCP one refuses without it.
func TestLocalSkipsToken(t *testing.T) {
	s, _ := newTestAPI(t, "secret-token-0123456789")
	for _, tc := range []struct {
		name string
		h    http.Handler
		want int
	}{
		{"token checked", s, http.StatusUnauthorized},
		{"local", s.Local(), http.StatusOK},
	} {
		rec := httptest.NewRecorder()
		tc.h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/volumes", strings.NewReader("")))
		if rec.Code != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, rec.Code, tc.want)
		}
	}
}
