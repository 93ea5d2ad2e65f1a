package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/audit"
	"github.com/quiverstorage/quiver/internal/auth"
	"github.com/quiverstorage/quiver/internal/backup"
	"github.com/quiverstorage/quiver/internal/dr"
	"github.com/quiverstorage/quiver/internal/job"
	"github.com/quiverstorage/quiver/internal/metrics"
	"github.com/quiverstorage/quiver/internal/pool"
)

// Server serves the v1 API over a pool.
type Server struct {
	// BodyTimeout bounds the reading of a request's body (default 10 s;
	// set before serving). The headers are bounded by the http.Server.
	BodyTimeout time.Duration
	// MaxOvercommit refuses creates, clones and disk changes that would
	// provision more than this many times the pool's size; 0: no limit.
	MaxOvercommit float64
	// Cluster, when set (before serving), makes volume creation, deletion
	// and lookup cluster-wide (docs/cluster.md); nil on a single node.
	Cluster Cluster
	// Auth, when set (before serving), authenticates stored tokens and
	// keeps tenants' quotas (docs/security.md, "Tenants").
	Auth *auth.Store
	// RequireToken refuses requests without a token even when the server
	// has no --token-file token (a non-loopback API, --require-token).
	RequireToken bool

	quotas quotas
	// updateMu orders the updates of placed volumes (capacity, labels,
	// QoS): each is recorded in etcd, then made, one at a time, so the
	// record and the copies end with the same one.
	updateMu   sync.Mutex
	jobTenants sync.Map // job ID -> tenant that started it
	conns      sync.Map // net.Conn -> *connTrack
	// Replicated takes and deletes the snapshots of replicated volumes on
	// every copy (nil on a single node).
	Replicated Replicated
	// Drainer drains this node (`quiver node drain`); nil on a single
	// node.
	Drainer Drainer
	// Membership adds and removes nodes (`quiver node add`, `quiver node
	// remove`); nil on a single node.
	Membership Membership
	// Peers, when set (before serving), carries the requests that must
	// run on a volume's primary to it (forward.go); nil on a single node.
	Peers *Peers
	// Audit, when set (before serving), records every change asked and
	// every refused credential (audit.go); nil: none recorded.
	Audit *audit.Log
	// Backups, when set (before serving), backs volumes up to the
	// configured targets (backup.go); nil: the backup routes answer that
	// the server has no backup configuration.
	Backups *backup.Service
	// DRTargets, when set (before serving), receives the points of the
	// relationships this site is the target of; DRSites, the sites this
	// server ships to (dr.go). nil: those routes answer that there are
	// none.
	DRTargets *dr.Targets
	DRSites   *dr.Sites
	// DR, set with DRSites, runs the volumes' DR policies and their syncs.
	DR *dr.Scheduler
	// IO, when set (before serving), reads the volumes' data-path counters
	// for GET /v1/volumes/{volume}/stats; nil: that route answers 422
	// NotSupported.
	IO IOCounters

	pool  *pool.Pool
	jobs  *job.Manager
	token string
	log   *slog.Logger
	mux   *http.ServeMux
	// draining is set when the server begins to shut down: /readyz then
	// answers 503 so that a load balancer or kubelet stops sending work.
	draining atomic.Bool
	nbd      NBDEndpoint
	// public are the handlers served without a credential (MountPublic),
	// by path prefix.
	public []publicMount
}

// IOCounters reads what a volume's data path has done on this node
// (metrics.Metrics).
type IOCounters interface {
	VolumeIO(volume string) metrics.VolumeIO
}

type publicMount struct {
	prefix string
	h      http.Handler
}

// NewServer returns the API handler. With a non-empty token every request
// must carry "Authorization: Bearer <token>".
func NewServer(p *pool.Pool, jobs *job.Manager, token string, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	s := &Server{pool: p, jobs: jobs, token: token, log: log, mux: http.NewServeMux(), BodyTimeout: 10 * time.Second}
	s.routes()
	return s
}

// Mount serves h at pattern (e.g. "GET /metrics") behind the same
// authentication as the API, for callers that may read the whole node.
func (s *Server) Mount(pattern string, h http.Handler) {
	s.mux.Handle(pattern, s.handle(s.authorize(auth.ActNode, func(w http.ResponseWriter, r *http.Request) error {
		h.ServeHTTP(w, r)
		return nil
	})))
}

// MountPublic serves h for every GET and HEAD under prefix (which ends in
// "/") without a credential, and redirects prefix without its slash there:
// for files that hold no data and no secret, such as the web console's,
// whose every API call then carries the user's own credential. Call it
// before serving.
func (s *Server) MountPublic(prefix string, h http.Handler) {
	s.public = append(s.public, publicMount{prefix: prefix, h: h})
}

// servePublic answers a request under a MountPublic prefix and reports
// whether r was one.
func (s *Server) servePublic(w http.ResponseWriter, r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	for _, m := range s.public {
		switch {
		case r.URL.Path == strings.TrimSuffix(m.prefix, "/"):
			http.Redirect(w, r, m.prefix, http.StatusMovedPermanently)
			return true
		case strings.HasPrefix(r.URL.Path, m.prefix):
			m.h.ServeHTTP(w, r)
			return true
		}
	}
	return false
}

type route struct {
	h   func(http.ResponseWriter, *http.Request) error
	act auth.Action // what the caller's role must allow
}

func (s *Server) routes() {
	for pattern, rt := range map[string]route{
		"GET /v1/pool":                                            {s.getPool, auth.ActRead},
		"GET /v1/version":                                         {s.getVersion, auth.ActRead},
		"GET /v1/whoami":                                          {s.whoami, auth.ActRead},
		"GET /v1/usage":                                           {s.getUsage, auth.ActNode},
		"GET /v1/volumes":                                         {s.listVolumes, auth.ActRead},
		"POST /v1/volumes":                                        {s.createVolume, auth.ActWrite},
		"GET /v1/volumes/{volume}":                                {s.getVolume, auth.ActRead},
		"PATCH /v1/volumes/{volume}":                              {s.updateVolume, auth.ActWrite},
		"GET /v1/volumes/{volume}/primary":                        {s.getPrimary, auth.ActRead},
		"GET /v1/volumes/{volume}/stats":                          {s.getVolumeStats, auth.ActRead},
		"DELETE /v1/volumes/{volume}":                             {s.deleteVolume, auth.ActWrite},
		"POST /v1/volumes/{volume}/disks":                         {s.addDisk, auth.ActWrite},
		"PATCH /v1/volumes/{volume}/disks/{disk}":                 {s.growDisk, auth.ActWrite},
		"DELETE /v1/volumes/{volume}/disks/{disk}":                {s.removeDisk, auth.ActWrite},
		"GET /v1/snapshots":                                       {s.findSnapshots, auth.ActRead},
		"GET /v1/volumes/{volume}/snapshots":                      {s.listSnapshots, auth.ActRead},
		"POST /v1/volumes/{volume}/snapshots":                     {s.createSnapshot, auth.ActWrite},
		"GET /v1/volumes/{volume}/snapshots/{snapshot}":           {s.getSnapshot, auth.ActRead},
		"DELETE /v1/volumes/{volume}/snapshots/{snapshot}":        {s.deleteSnapshot, auth.ActWrite},
		"GET /v1/volumes/{volume}/snapshots/{snapshot}/allocated": {s.snapshotAllocated, auth.ActRead},
		"GET /v1/volumes/{volume}/snapshots/{snapshot}/changes":   {s.snapshotChanges, auth.ActRead},
		"PUT /v1/volumes/{volume}/direct-access/{holder}":         {s.setDirectAccess, auth.ActAttach},
		"DELETE /v1/volumes/{volume}/direct-access/{holder}":      {s.clearDirectAccess, auth.ActAttach},
		"PUT /v1/volumes/{volume}/backup-policy":                  {s.setBackupPolicy, auth.ActWrite},
		"DELETE /v1/volumes/{volume}/backup-policy":               {s.deleteBackupPolicy, auth.ActWrite},
		"GET /v1/backup-status":                                   {s.backupStatus, auth.ActRead},
		"GET /v1/backup-targets":                                  {s.listBackupTargets, auth.ActRead},
		"POST /v1/backup-targets/{target}/init":                   {s.initBackupTarget, auth.ActAdmin},
		"POST /v1/backup-targets/{target}/collect":                {s.collectBackupTarget, auth.ActAdmin},
		"POST /v1/volumes/{volume}/backups":                       {s.createBackup, auth.ActWrite},
		"GET /v1/backups":                                         {s.listBackups, auth.ActRead},
		"GET /v1/backups/{id}":                                    {s.getBackup, auth.ActRead},
		"DELETE /v1/backups/{id}":                                 {s.deleteBackup, auth.ActWrite},
		"POST /v1/backups/{id}/restore":                           {s.restoreBackup, auth.ActWrite},
		"POST /v1/backups/{id}/verify":                            {s.verifyBackup, auth.ActRead},
		"POST /v1/volumes/{volume}/rollback":                      {s.rollback, auth.ActWrite},
		"POST /v1/volumes/{volume}/rekey":                         {s.rekey, auth.ActWrite},
		"GET /v1/dr/targets":                                      {s.listDRTargets, auth.ActAdmin},
		"POST /v1/dr/targets":                                     {s.acceptDRTarget, auth.ActAdmin},
		"GET /v1/dr/targets/{relationship}":                       {s.getDRTarget, auth.ActAdmin},
		"POST /v1/dr/targets/{relationship}/promote":              {s.promoteDRTarget, auth.ActAdmin},
		"POST /v1/dr/targets/{relationship}/begin":                {s.beginDRPoint, auth.ActAdmin},
		"PUT /v1/dr/targets/{relationship}/disks/{disk}/data":     {s.writeDRData, auth.ActAdmin},
		"POST /v1/dr/targets/{relationship}/disks/{disk}/zero":    {s.zeroDRData, auth.ActAdmin},
		"POST /v1/dr/targets/{relationship}/commit":               {s.commitDRPoint, auth.ActAdmin},
		"GET /v1/dr/sites":                                        {s.listDRSites, auth.ActAdmin},
		"POST /v1/volumes/{volume}/dr/sync":                       {s.syncDR, auth.ActAdmin},
		"PUT /v1/volumes/{volume}/dr-policy":                      {s.setDRPolicy, auth.ActAdmin},
		"DELETE /v1/volumes/{volume}/dr-policy":                   {s.deleteDRPolicy, auth.ActAdmin},
		"GET /v1/dr/status":                                       {s.drStatus, auth.ActAdmin},
		"POST /v1/volumes/{volume}/dr/demote":                     {s.demoteDR, auth.ActAdmin},
		"POST /v1/clones":                                         {s.clone, auth.ActWrite},
		"GET /v1/attachments":                                     {s.findAttachments, auth.ActRead},
		"GET /v1/volumes/{volume}/attachments":                    {s.listAttachments, auth.ActRead},
		"POST /v1/volumes/{volume}/attachments":                   {s.attach, auth.ActAttach},
		"GET /v1/volumes/{volume}/attachments/{id}":               {s.getAttachment, auth.ActRead},
		"DELETE /v1/volumes/{volume}/attachments/{id}":            {s.detach, auth.ActAttach},
		"POST /v1/volumes/{volume}/attachments/{id}/writer":       {s.transferWriter, auth.ActAttach},
		"GET /v1/nodes":                                           {s.listNodes, auth.ActNode},
		"POST /v1/nodes/{node}/drain":                             {s.drainNode, auth.ActAdmin},
		"DELETE /v1/nodes/{node}/drain":                           {s.undrainNode, auth.ActAdmin},
		"POST /v1/nodes":                                          {s.addNode, auth.ActAdmin},
		"DELETE /v1/nodes/{node}":                                 {s.removeNode, auth.ActAdmin},
		"POST /v1/nodes/{node}/replace":                           {s.replaceNode, auth.ActAdmin},
		"GET /v1/jobs":                                            {s.listJobs, auth.ActRead},
		"GET /v1/jobs/{id}":                                       {s.getJob, auth.ActRead},
		"DELETE /v1/jobs/{id}":                                    {s.cancelJob, auth.ActWrite},
		"GET /v1/events":                                          {s.listEvents, auth.ActRead},
		"GET /v1/tokens":                                          {s.listTokens, auth.ActAdmin},
		"POST /v1/tokens":                                         {s.createToken, auth.ActAdmin},
		"DELETE /v1/tokens/{id}":                                  {s.revokeToken, auth.ActAdmin},
		"GET /v1/tenants":                                         {s.listTenants, auth.ActAdmin},
		"PUT /v1/tenants/{tenant}":                                {s.setTenant, auth.ActAdmin},
	} {
		h := s.tenantOnCluster(pattern, rt.h)
		if g, ok := replicatedGuards[pattern]; ok {
			h = s.guardReplicated(g, h)
		}
		switch pattern {
		case "POST /v1/clones":
			h = s.cloneOnPrimary(h)
		case "GET /v1/jobs/{id}", "DELETE /v1/jobs/{id}":
			h = s.remoteJob(h)
		}
		s.mux.Handle(pattern, s.handle(s.authorize(rt.act, h)))
	}
}

// Drain makes /readyz answer 503 from now on; the server calls it when it
// begins to shut down.
func (s *Server) Drain() { s.draining.Store(true) }

// Health probes, answered without a token: they say only whether the
// process lives (/healthz) and whether it takes work (/readyz), as
// Kubernetes probes and load balancers expect.
const (
	pathHealthz = "/healthz"
	pathReadyz  = "/readyz"
)

// probe answers /healthz and /readyz and reports whether r was one.
func (s *Server) probe(w http.ResponseWriter, r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	switch r.URL.Path {
	case pathHealthz:
	case pathReadyz:
		if s.draining.Load() {
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return true
		}
	default:
		return false
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, "ok\n")
	return true
}

// ServeHTTP answers the health probes, checks the token, then routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.probe(w, r) || s.servePublic(w, r) || s.serveHop(w, r) {
		return
	}
	w, record := s.audited(w, r, remoteOf(r))
	p, err := s.authenticate(r)
	if err != nil {
		s.writeError(w, r, err)
		record(nil)
		return
	}
	s.watchRevocation(r, p)
	s.route(w, withPrincipal(r, p))
	record(&p)
}

// Local returns the API without the token check, for a unix socket whose
// file permissions decide who may connect (docs/security.md). Never serve
// it on a TCP listener.
func (s *Server) Local() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.probe(w, r) {
			w, record := s.audited(w, r, "local")
			s.route(w, withPrincipal(r, auth.Anonymous))
			record(&auth.Anonymous)
		}
	})
}

// route serves an authorized request.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	// ServeMux answers an unclean path with a method-preserving redirect
	// to the cleaned one, so DELETE .../snapshots/.. would land on
	// DELETE /v1/volumes/{volume}. Refuse such paths instead.
	if p := r.URL.EscapedPath(); !isCleanPath(p) {
		s.writeError(w, r, &badRequest{field: "path",
			msg: fmt.Sprintf("path %q: must not have empty, \".\" or \"..\" segments", p)})
		return
	}
	if err := s.readBody(w, r); err != nil {
		s.writeError(w, r, err)
		return
	}
	h, pattern := s.mux.Handler(r)
	if pattern == "" {
		// No route matched: answer in JSON with the mux's status (404 or
		// 405) instead of its plain-text body.
		rec := &statusRecorder{header: http.Header{}}
		h.ServeHTTP(rec, r)
		if rec.status == http.StatusMethodNotAllowed {
			allow := rec.header.Get("Allow")
			w.Header().Set("Allow", allow)
			s.writeError(w, r, fmt.Errorf("%s %q: %w (allowed: %s)", r.Method, r.URL.Path, errMethod, allow))
			return
		}
		s.writeError(w, r, fmt.Errorf("%s %q: %w", r.Method, r.URL.Path, errRouteNotFound))
		return
	}
	s.mux.ServeHTTP(w, r)
}

// readBody reads the request's body (up to maxBody and one byte, which
// decode refuses) within BodyTimeout, then lifts the deadline so that a long
// synchronous operation is not cut short: a client that trickles its body
// holds its connection for BodyTimeout at most.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) error {
	if r.Body == nil || r.Body == http.NoBody {
		return nil
	}
	rc := http.NewResponseController(w)
	deadline := rc.SetReadDeadline(time.Now().Add(s.BodyTimeout)) == nil
	data, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		// The deadline stays: net/http would otherwise wait for the rest
		// of the body before it answers.
		w.Header().Set("Connection", "close")
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return &badRequest{msg: fmt.Sprintf("request body: not received within %v", s.BodyTimeout)}
		}
		return &badRequest{msg: "request body: " + err.Error()}
	}
	if deadline {
		_ = rc.SetReadDeadline(time.Time{})
	}
	r.Body = io.NopCloser(bytes.NewReader(data))
	noteBody(w, data)
	return nil
}

// isCleanPath reports whether ServeMux routes p as it is, rather than
// redirecting to a cleaned path: no empty, "." or ".." segments.
func isCleanPath(p string) bool {
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c == p
}

// handle adapts a handler that returns an error, mapping it once.
func (s *Server) handle(h func(http.ResponseWriter, *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := h(w, r); err != nil {
			s.writeError(w, r, err)
		}
	})
}

func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status, e := toError(err)
	noteCode(w, e.Code)
	if status >= 500 {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	} else {
		s.log.Debug("request refused", "method", r.Method, "path", r.URL.Path, "status", status, "err", err)
	}
	writeJSON(w, status, api.ErrorBody{Error: e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

type statusRecorder struct {
	header http.Header
	status int
}

func (r *statusRecorder) Header() http.Header         { return r.header }
func (r *statusRecorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *statusRecorder) WriteHeader(status int)      { r.status = status }

// runJob starts fn as a job. With ?async=true it answers 202 with the job;
// otherwise it waits for the job and calls done with its result. A client
// that goes away does not cancel the job.
func (s *Server) runJob(w http.ResponseWriter, r *http.Request, kind, target string, items int,
	fn func(ctx context.Context, j *job.Job) error, done func() error) error {
	j := s.jobs.Start(kind, target, items, fn)
	if t := principalOf(r).Tenant; t != "" {
		s.jobTenants.Store(j.Status().ID, t)
	}
	if r.URL.Query().Get("async") == "true" {
		writeJSON(w, http.StatusAccepted, viewOf(r).job(jobToAPI(j.Status())))
		return nil
	}
	if err := j.Wait(r.Context()); err != nil {
		return err
	}
	return done()
}
