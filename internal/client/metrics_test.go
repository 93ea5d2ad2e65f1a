package client

import (
	"context"
	"slices"
	"strings"
	"testing"
)

// scrape is a /metrics answer as the Prometheus Go client writes it.
const scrape = `# HELP quiver_disk_requests_total Requests completed by the data path.
# TYPE quiver_disk_requests_total counter
quiver_disk_requests_total{disk="root",op="read",volume="web01"} 120
quiver_disk_requests_total{disk="root",op="write",volume="web01"} 30
quiver_disk_requests_total{disk="data",op="read",volume="web01"} 7
quiver_disk_requests_total{disk="root",op="read",volume="db"} 1e+06
# HELP quiver_disk_request_duration_seconds Time from admission to completion.
# TYPE quiver_disk_request_duration_seconds histogram
quiver_disk_request_duration_seconds_bucket{disk="root",op="read",volume="web01",le="0.001"} 100
quiver_disk_request_duration_seconds_bucket{disk="root",op="read",volume="web01",le="0.01"} 118
quiver_disk_request_duration_seconds_bucket{disk="root",op="read",volume="web01",le="+Inf"} 120
quiver_disk_request_duration_seconds_sum{disk="root",op="read",volume="web01"} 0.25
quiver_disk_request_duration_seconds_count{disk="root",op="read",volume="web01"} 120
# HELP quiver_nbd_connections Open NBD connections.
# TYPE quiver_nbd_connections gauge
quiver_nbd_connections 3
`

func TestMetricsScrapesAndParses(t *testing.T) {
	f, c := newFake(t, cannedResponse{status: 200, body: scrape})
	m, err := c.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := f.last(t); got.Method != "GET" || got.Path != "/metrics" || got.Auth != "Bearer s3cret" {
		t.Fatalf("request %+v", got)
	}
	tests := []struct {
		name  string
		match map[string]string
		want  float64
	}{
		{"quiver_disk_requests_total", map[string]string{"volume": "web01"}, 157},
		{"quiver_disk_requests_total", map[string]string{"volume": "web01", "disk": "root", "op": "read"}, 120},
		{"quiver_disk_requests_total", nil, 1_000_157},
		{"quiver_disk_requests_total", map[string]string{"volume": "nope"}, 0},
		{"quiver_disk_request_duration_seconds_sum", map[string]string{"op": "read"}, 0.25},
		{"quiver_disk_request_duration_seconds_count", map[string]string{"disk": "root"}, 120},
		{"quiver_disk_request_duration_seconds_bucket", map[string]string{"le": "0.01"}, 118},
		{"quiver_disk_request_duration_seconds_bucket", map[string]string{"le": "+Inf"}, 120},
		{"quiver_nbd_connections", nil, 3},
		{"no_such_metric", nil, 0},
	}
	for _, tt := range tests {
		if got := m.Sum(tt.name, tt.match); got != tt.want {
			t.Errorf("Sum(%s, %v) = %v, want %v", tt.name, tt.match, got, tt.want)
		}
	}
	if n := len(m.Samples("quiver_disk_request_duration_seconds_bucket", nil)); n != 3 {
		t.Errorf("%d bucket series, want 3", n)
	}
	want := []string{
		"quiver_disk_request_duration_seconds_bucket", "quiver_disk_request_duration_seconds_count",
		"quiver_disk_request_duration_seconds_sum", "quiver_disk_requests_total", "quiver_nbd_connections",
	}
	if got := m.Names(); !slices.Equal(got, want) {
		t.Errorf("Names() = %v, want %v", got, want)
	}
}

func TestMetricsErrors(t *testing.T) {
	_, c := newFake(t, cannedResponse{status: 401, body: `{"error":{"code":"Unauthorized","message":"missing or wrong bearer token"}}`})
	if _, err := c.Metrics(context.Background()); !IsUnauthorized(err) {
		t.Fatalf("err = %v, want unauthorized", err)
	}
	_, c = newFake(t, cannedResponse{status: 200, body: "quiver_x{volume=\"unterminated} 1\n"})
	if _, err := c.Metrics(context.Background()); err == nil || !strings.Contains(err.Error(), "parse metrics") {
		t.Fatalf("err = %v, want a parse error", err)
	}
}
