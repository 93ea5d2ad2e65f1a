package cli

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
)

func testEvent(seq int64, route string, names map[string]string, status int, code string) api.Event {
	return api.Event{Seq: seq, Time: testNow.Add(time.Duration(seq) * time.Second), Method: strings.Fields(route)[0], Route: route,
		Names: names, Status: status, Code: code,
		Who: api.EventWho{TokenID: "tk-0123456789ab", Role: "tenant", Tenant: "acme", Remote: "10.0.0.7"}}
}

// TestEvents: the table of the log, --since sent as a time, a bad --since
// refused before any request.
func TestEvents(t *testing.T) {
	f, url := newFakeAPI(t)
	f.reply("GET /v1/events", 200, api.List[api.Event]{Items: []api.Event{
		testEvent(1, "POST /v1/volumes", map[string]string{"name": "db"}, 201, ""),
		testEvent(2, "DELETE /v1/volumes/{volume}", map[string]string{"volume": "db"}, 403, api.CodeForbidden),
	}})
	got := run(t, context.Background(), url, nil, "events", "--since", "1h")
	want := `SEQ   TIME                   WHO                             ROLE     TENANT   REQUEST                       NAMES       RESULT
1     2026-03-01T12:00:01Z   tk-0123456789ab from 10.0.0.7   tenant   acme     POST /v1/volumes              name=db     201
2     2026-03-01T12:00:02Z   tk-0123456789ab from 10.0.0.7   tenant   acme     DELETE /v1/volumes/{volume}   volume=db   403 Forbidden
`
	if got.code != 0 || got.stdout != want {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s\nwant:\n%s", got.code, got.stderr, got.stdout, want)
	}
	if !f.sent("GET /v1/events?since=2026-03-01T11%3A00%3A00Z") {
		t.Errorf("sent %v", f.requests)
	}
	got = run(t, context.Background(), url, nil, "-o", "json", "events")
	var list api.List[api.Event]
	if err := json.Unmarshal([]byte(got.stdout), &list); err != nil || len(list.Items) != 2 || list.Items[1].Code != api.CodeForbidden {
		t.Errorf("-o json: %v %s", err, got.stdout)
	}
	n := len(f.requests)
	if got := run(t, context.Background(), url, nil, "events", "--since", "yesterday"); got.code == 0 ||
		!strings.Contains(got.stderr, "--since") || len(f.requests) != n {
		t.Errorf("--since yesterday: exit %d, stderr %q, %d requests sent", got.code, got.stderr, len(f.requests)-n)
	}
}

// TestEventsFollow: --follow asks for the events after the last it
// printed, prints each once, one JSON object a line with -o json, and
// ends without an error when interrupted.
func TestEventsFollow(t *testing.T) {
	f, url := newFakeAPI(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var afters []string
	f.routes["GET /v1/events"] = func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		after := r.URL.Query().Get("after")
		afters = append(afters, after)
		if len(afters) > 50 {
			cancel() // it does not follow: end the test
		}
		var evs []api.Event
		switch after {
		case "":
			evs = []api.Event{testEvent(1, "POST /v1/volumes", nil, 201, ""), testEvent(2, "POST /v1/clones", nil, 201, "")}
		case "2":
			if len(afters) < 4 {
				break // nothing new for a while
			}
			evs = []api.Event{testEvent(3, "DELETE /v1/volumes/{volume}", nil, 204, "")}
		case "3":
			cancel() // interrupted while it waits for more
		}
		writeJSON(w, 200, api.List[api.Event]{Items: nonNil(evs)})
	}
	got := run(t, ctx, url, nil, "-o", "json", "events", "--follow")
	if got.code != 0 {
		t.Fatalf("exit %d, stderr %q", got.code, got.stderr)
	}
	lines := strings.Split(strings.TrimSpace(got.stdout), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3:\n%s", len(lines), got.stdout)
	}
	for i, l := range lines {
		var ev api.Event
		if err := json.Unmarshal([]byte(l), &ev); err != nil || ev.Seq != int64(i+1) {
			t.Errorf("line %d: %v %q", i, err, l)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if afters[len(afters)-1] != "3" {
		t.Errorf("last request after=%q, want 3", afters[len(afters)-1])
	}
	for i, a := range afters[1 : len(afters)-1] {
		if a != "2" {
			t.Errorf("request %d: after=%q, want 2", i+1, a)
		}
	}
}
