package blockdev

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
)

// Request is one call to a device agent: the arguments of Devices.
type Request struct {
	FuseDir  string `json:"fuseDir"`
	File     string `json:"file"`
	URI      string `json:"uri,omitempty"`
	ReadOnly bool   `json:"readOnly,omitempty"`
	Loop     string `json:"loop,omitempty"`
	PID      int    `json:"pid,omitempty"`
}

// Reply is a device agent's answer. Code is set on failure: "BadRequest",
// "NoTool" or "Failed".
type Reply struct {
	Loop    string `json:"loop,omitempty"`
	PID     int    `json:"pid,omitempty"`
	Healthy bool   `json:"healthy,omitempty"`
	Code    string `json:"code,omitempty"`
	Error   string `json:"error,omitempty"`
}

// maxRequest bounds a request body: paths, a URI with a token.
const maxRequest = 16 << 10

// Agent serves Devices to clients on a unix socket: `quiver device-agent`.
// The processes and loop devices it makes are its children and outlive
// every client, so a CSI node plugin that restarts (an upgrade of its
// DaemonSet, a crash) leaves the block devices of running VMs alone, and
// finds them again from its own records.
//
// Whoever can connect to the socket can expose any NBD export it has a URI
// for as a block device on this node, so the socket must be reachable by
// the node plugin alone (0600, root). Every request is checked: FUSE
// directories only directly under Root, plain file names, NBD URIs only,
// loop devices by name, and a pid is only ever signalled when it is an
// nbdfuse process (Detach's rule).
type Agent struct {
	Root    string  // the only parent directory of FUSE directories
	Devices Devices // what does the work (NewNbdfuseLoop)
	Log     *slog.Logger

	mu    sync.Mutex
	locks map[string]*dirLock // per FUSE directory, while a request holds or waits for it
}

// dirLock serializes the requests on one FUSE directory; users counts the
// requests holding or waiting for it, and the last one removes it, so the
// map holds only the directories in use (a node that publishes and
// unpublishes volumes for months does not grow it).
type dirLock struct {
	mu    sync.Mutex
	users int
}

// Handler returns the agent's HTTP handler: POST /v1/attach, /v1/detach,
// /v1/healthy, each with a Request in JSON.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/attach", a.serve(func(ctx context.Context, r Request) (Reply, error) {
		loop, pid, err := a.Devices.Attach(ctx, r.FuseDir, r.File, r.URI, r.ReadOnly)
		if err == nil {
			a.log().Info("attached", "fuseDir", r.FuseDir, "file", r.File, "loop", loop, "pid", pid, "readOnly", r.ReadOnly)
		}
		return Reply{Loop: loop, PID: pid}, err
	}))
	mux.HandleFunc("POST /v1/detach", a.serve(func(ctx context.Context, r Request) (Reply, error) {
		err := a.Devices.Detach(ctx, r.FuseDir, r.File, r.Loop, r.PID)
		if err == nil {
			a.log().Info("detached", "fuseDir", r.FuseDir, "loop", r.Loop, "pid", r.PID)
		}
		return Reply{}, err
	}))
	mux.HandleFunc("POST /v1/healthy", a.serve(func(ctx context.Context, r Request) (Reply, error) {
		ok, err := a.Devices.Healthy(ctx, r.FuseDir, r.File, r.Loop, r.PID)
		return Reply{Healthy: ok}, err
	}))
	return mux
}

func (a *Agent) log() *slog.Logger {
	if a.Log == nil {
		return slog.Default()
	}
	return a.Log
}

// serve decodes and checks a request, runs op under the lock of its FUSE
// directory and answers.
func (a *Agent) serve(op func(context.Context, Request) (Reply, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, hr *http.Request) {
		var r Request
		dec := json.NewDecoder(http.MaxBytesReader(w, hr.Body, maxRequest))
		dec.DisallowUnknownFields()
		err := dec.Decode(&r)
		if err != nil {
			err = fmt.Errorf("%w: request body: %v", ErrBadRequest, err)
		} else {
			err = a.check(r, strings.HasSuffix(hr.URL.Path, "/attach"))
		}
		if err != nil {
			a.log().Warn("request refused", "path", hr.URL.Path, "err", err)
			reply(w, Reply{}, err)
			return
		}
		unlock := a.lock(r.FuseDir)
		defer unlock()
		out, err := op(hr.Context(), r)
		if err != nil {
			a.log().Error("request failed", "path", hr.URL.Path, "fuseDir", r.FuseDir, "err", err)
		}
		reply(w, out, err)
	}
}

func (a *Agent) lock(dir string) func() {
	a.mu.Lock()
	if a.locks == nil {
		a.locks = map[string]*dirLock{}
	}
	l, ok := a.locks[dir]
	if !ok {
		l = &dirLock{}
		a.locks[dir] = l
	}
	l.users++
	a.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		a.mu.Lock()
		if l.users--; l.users == 0 {
			delete(a.locks, dir)
		}
		a.mu.Unlock()
	}
}

// lockedDirs is how many FUSE directories have a lock now.
func (a *Agent) lockedDirs() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.locks)
}

var loopName = regexp.MustCompile(`^/dev/loop[0-9]{1,6}$`)

// check refuses a request that is malformed or reaches outside Root.
func (a *Agent) check(r Request, attach bool) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadRequest, fmt.Sprintf(format, args...))
	}
	root := filepath.Clean(a.Root)
	if !filepath.IsAbs(r.FuseDir) || filepath.Clean(r.FuseDir) != r.FuseDir || filepath.Dir(r.FuseDir) != root {
		return bad("fuseDir %q: must be a directory directly under %s", r.FuseDir, root)
	}
	if !plainName(filepath.Base(r.FuseDir)) {
		return bad("fuseDir %q: not a plain name under %s", r.FuseDir, root)
	}
	if !plainName(r.File) {
		return bad("file %q: must be a plain file name", r.File)
	}
	if r.Loop != "" && !loopName.MatchString(r.Loop) {
		return bad("loop %q: must be a /dev/loopN device", r.Loop)
	}
	if r.PID < 0 {
		return bad("pid %d: must not be negative", r.PID)
	}
	if !attach {
		if r.URI != "" {
			return bad("uri is only for attach")
		}
		return nil
	}
	u, err := url.Parse(r.URI)
	if err != nil {
		return bad("uri: not a URI") // the URI holds a token: never echo it
	}
	switch u.Scheme {
	case "nbd", "nbds", "nbd+unix", "nbds+unix":
	default:
		return bad("uri scheme %q: want nbd://, nbds://, nbd+unix:// or nbds+unix://", u.Scheme)
	}
	if r.Loop != "" || r.PID != 0 {
		return bad("loop and pid are not arguments of attach")
	}
	return nil
}

// plainName is a single path element that is not "." or "..".
func plainName(s string) bool {
	return s != "" && len(s) <= 255 && s != "." && s != ".." && !strings.ContainsAny(s, "/\x00")
}

// reply writes out, or err mapped to a status and code: the only place the
// agent's errors meet HTTP.
func reply(w http.ResponseWriter, out Reply, err error) {
	status := http.StatusOK
	switch {
	case err == nil:
	case errors.Is(err, ErrBadRequest):
		status, out = http.StatusBadRequest, Reply{Code: "BadRequest", Error: err.Error()}
	case errors.Is(err, ErrNoTool):
		status, out = http.StatusPreconditionFailed, Reply{Code: "NoTool", Error: err.Error()}
	default:
		status, out = http.StatusInternalServerError, Reply{Code: "Failed", Error: err.Error()}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(out)
}
