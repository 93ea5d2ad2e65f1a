package apiserver

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/audit"
	"github.com/quiverstorage/quiver/internal/auth"
)

// The audit log (docs/security.md, "Audit log"): with Server.Audit set,
// every request that is not a GET or HEAD, and every request refused for
// its credential (401, 403), is recorded as one audit.Log event: who (the
// principal, the client certificate's subject, the client's address), what
// (the method, the route's pattern, the names in its path and, for a
// create, the names in its body: never the body itself) and the result
// (status and error code). The event is appended and fsync'd after the
// handler returns and before ServeHTTP returns, so before the HTTP server
// completes the response: a client that has read a whole answer knows its
// event is on disk. A request another node forwards here (a hop) is
// recorded by the node the client called, not again here. A failure to
// record is logged; the request's answer stands.

// auditWriter records the status and the error code a request is answered.
type auditWriter struct {
	http.ResponseWriter
	status int
	code   string
	body   []byte // the request's body, as readBody read it
}

func (w *auditWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *auditWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (readBody's
// deadlines).
func (w *auditWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// audited returns w wrapped to record r's result, and the function that
// records it once served, acting for *who (set once r is authenticated);
// w itself and a no-op without an audit log.
func (s *Server) audited(w http.ResponseWriter, r *http.Request, remote string) (http.ResponseWriter, func(who *auth.Principal)) {
	if s.Audit == nil {
		return w, func(*auth.Principal) {}
	}
	aw := &auditWriter{ResponseWriter: w}
	return aw, func(who *auth.Principal) {
		status := aw.status
		if status == 0 {
			status = http.StatusOK
		}
		read := r.Method == http.MethodGet || r.Method == http.MethodHead
		if read && status != http.StatusUnauthorized && status != http.StatusForbidden {
			return
		}
		ev := api.Event{Time: time.Now().UTC(), Method: r.Method, Status: status, Code: aw.code,
			Who: api.EventWho{Remote: remote}}
		if who != nil {
			ev.Who.TokenID, ev.Who.Role, ev.Who.Tenant = who.TokenID, string(who.Role), who.Tenant
		}
		if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
			ev.Who.Cert = r.TLS.VerifiedChains[0][0].Subject.String()
		}
		if _, pattern := s.mux.Handler(r); pattern != "" {
			ev.Route = pattern
			ev.Names = pathNames(pattern, r.URL.EscapedPath())
		}
		if !read {
			bodyNames(aw.body, &ev)
		}
		if err := s.Audit.Append(ev); err != nil {
			s.log.Error("audit log: event not recorded", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
		}
	}
}

// noteBody keeps the body readBody read, for the event's names.
func noteBody(w http.ResponseWriter, data []byte) {
	if aw, ok := w.(*auditWriter); ok {
		aw.body = data
	}
}

// noteCode keeps the code of the error w is answered.
func noteCode(w http.ResponseWriter, code string) {
	if aw, ok := w.(*auditWriter); ok {
		aw.code = code
	}
}

// pathNames returns the values of pattern's wildcards in the escaped path p.
func pathNames(pattern, p string) map[string]string {
	_, route, _ := strings.Cut(pattern, " ")
	rs, ps := strings.Split(route, "/"), strings.Split(p, "/")
	out := map[string]string{}
	for i, seg := range rs {
		if i >= len(ps) || !strings.HasPrefix(seg, "{") || !strings.HasSuffix(seg, "}") {
			continue
		}
		name := strings.TrimSuffix(strings.TrimPrefix(seg, "{"), "}")
		if v, err := url.PathUnescape(ps[i]); err == nil {
			out[name] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// bodyNames adds to ev the names a request's body gives what it makes or
// acts on (a volume's, a clone's source, a token's tenant and role, a node
// replace's new node): only these fields are read, never the rest of the
// body.
func bodyNames(body []byte, ev *api.Event) {
	if len(body) == 0 {
		return
	}
	var b struct {
		Name   string   `json:"name"`
		Tenant string   `json:"tenant"`
		Role   string   `json:"role"`
		Names  []string `json:"names"`
		New    string   `json:"new"` // a node replace's new node
		Source *struct {
			Volume   string `json:"volume"`
			Snapshot string `json:"snapshot"`
		} `json:"source"`
	}
	if json.Unmarshal(body, &b) != nil {
		return
	}
	add := func(k, v string) {
		if v == "" {
			return
		}
		if ev.Names == nil {
			ev.Names = map[string]string{}
		}
		if _, ok := ev.Names[k]; !ok {
			ev.Names[k] = v
		}
	}
	add("name", b.Name)
	add("tenant", b.Tenant)
	add("role", b.Role)
	add("names", strings.Join(b.Names, ","))
	add("new", b.New)
	if b.Source != nil {
		add("source.volume", b.Source.Volume)
		add("source.snapshot", b.Source.Snapshot)
	}
}

// remoteOf is the client's host, without its port.
func remoteOf(r *http.Request) string {
	if h, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return h
	}
	return r.RemoteAddr
}

// maxEvents bounds one answer of GET /v1/events.
const maxEvents = 10000

// listEvents answers GET /v1/events: the node's audit log, oldest first,
// ?after=SEQ (events numbered after it), ?since=RFC3339, ?limit=N (the
// last N; default and at most maxEvents). A token of a tenant reads only
// the events of its tenant's tokens.
func (s *Server) listEvents(w http.ResponseWriter, r *http.Request) error {
	if s.Audit == nil {
		return fmt.Errorf("this node keeps no audit log: %w", errRouteNotFound)
	}
	q := audit.Query{Limit: maxEvents}
	v := r.URL.Query()
	if a := v.Get("after"); a != "" {
		n, err := strconv.ParseInt(a, 10, 64)
		if err != nil || n < 0 {
			return &badRequest{field: "after", msg: fmt.Sprintf("after %q: must be an event's number (0 or more)", a)}
		}
		q.After = n
	}
	if since := v.Get("since"); since != "" {
		t, err := time.Parse(time.RFC3339Nano, since)
		if err != nil {
			return &badRequest{field: "since", msg: fmt.Sprintf("since %q: must be a time in RFC 3339 (2006-01-02T15:04:05Z)", since)}
		}
		q.Since = t
	}
	if l := v.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > maxEvents {
			return &badRequest{field: "limit", msg: fmt.Sprintf("limit %q: must be 1 to %d", l, maxEvents)}
		}
		q.Limit = n
	}
	if p := principalOf(r); p.Tenant != "" {
		q.Keep = func(ev api.Event) bool { return ev.Who.Tenant == p.Tenant }
	}
	evs, err := s.Audit.Read(q)
	if err != nil {
		return err
	}
	if evs == nil {
		evs = []api.Event{}
	}
	writeJSON(w, http.StatusOK, api.List[api.Event]{Items: evs})
	return nil
}
