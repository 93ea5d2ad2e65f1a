package endpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/quiverstorage/quiver/internal/blockdev"
)

// maxBody bounds a control request: a publication of maxDisks disks.
const maxBody = 64 << 10

// Handler is the endpoint's control API, served on a unix socket that only
// the CSI node plugin reaches (0600, root):
//
//	PUT    /v1/volumes/{volume}   publish (a Volume) -> Published
//	DELETE /v1/volumes/{volume}   unpublish
//	GET    /v1/volumes            the publications (no tokens)
//
// and, when agent is not nil, the device agent's routes (/v1/attach,
// /v1/detach, /v1/healthy: blockdev.Agent), so that the block devices of
// Block-mode volumes are the endpoint's children.
func (e *Endpoint) Handler(agent *blockdev.Agent) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/volumes/{volume}", func(w http.ResponseWriter, r *http.Request) {
		var v Volume
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&v); err != nil {
			answer(w, nil, fmt.Errorf("%w: request body: %v", ErrInvalid, err))
			return
		}
		if v.Name != r.PathValue("volume") {
			answer(w, nil, fmt.Errorf("%w: the body names volume %q, the path %q", ErrInvalid, v.Name, r.PathValue("volume")))
			return
		}
		p, err := e.Publish(r.Context(), v)
		answer(w, p, err)
	})
	mux.HandleFunc("DELETE /v1/volumes/{volume}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("volume")
		if err := (&Volume{Name: name, Token: "x", Disks: []Disk{{Name: "x"}}}).check(); err != nil {
			answer(w, nil, err)
			return
		}
		answer(w, nil, e.Unpublish(r.Context(), name))
	})
	mux.HandleFunc("GET /v1/volumes", func(w http.ResponseWriter, r *http.Request) {
		answer(w, e.List(), nil)
	})
	if agent != nil {
		mux.Handle("/v1/attach", agent.Handler())
		mux.Handle("/v1/detach", agent.Handler())
		mux.Handle("/v1/healthy", agent.Handler())
	}
	return mux
}

// controlError is the body of a failed control request.
type controlError struct {
	Code  string `json:"code"`
	Error string `json:"error"`
}

// answer writes out, or err mapped to a status: the only place the
// endpoint's errors meet HTTP.
func answer(w http.ResponseWriter, out any, err error) {
	w.Header().Set("Content-Type", "application/json")
	switch {
	case err == nil && out == nil:
		w.WriteHeader(http.StatusNoContent)
		return
	case err == nil:
		w.WriteHeader(http.StatusOK)
		_ = json.NewEncoder(w).Encode(out)
		return
	case errors.Is(err, ErrInvalid):
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(controlError{"Invalid", err.Error()})
	case errors.Is(err, ErrNotFound):
		w.WriteHeader(http.StatusNotFound)
		_ = json.NewEncoder(w).Encode(controlError{"NotFound", err.Error()})
	default:
		w.WriteHeader(http.StatusInternalServerError)
		_ = json.NewEncoder(w).Encode(controlError{"Failed", err.Error()})
	}
}
