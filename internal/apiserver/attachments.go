package apiserver

import (
	"net/http"

	"github.com/quiverstorage/quiver/internal/api"
)

func (s *Server) listAttachments(w http.ResponseWriter, r *http.Request) error {
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	out := api.List[api.Attachment]{Items: []api.Attachment{}}
	for _, a := range v.Attachments() {
		out.Items = append(out.Items, attachmentToAPI(a))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// findAttachments lists the attachments of every volume matching the
// selector (all volumes when none), by volume name.
func (s *Server) findAttachments(w http.ResponseWriter, r *http.Request) error {
	match, err := selector(r)
	if err != nil {
		return err
	}
	out := api.List[api.Attachment]{Items: []api.Attachment{}}
	for _, info := range s.pool.List(match) {
		v, err := s.pool.Volume(info.Name)
		if err != nil {
			continue // deleted since List, or quarantined: nothing attached to serve
		}
		for _, a := range v.Attachments() {
			out.Items = append(out.Items, attachmentToAPI(a))
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) attach(w http.ResponseWriter, r *http.Request) error {
	var spec api.AttachmentSpec
	if err := decode(r, &spec); err != nil {
		return err
	}
	idem, err := idempotency(r)
	if err != nil {
		return err
	}
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	a, created, err := v.AttachWith(spec.Node, spec.Mode, idem)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		s.log.Info("attached", "volume", v.Name(), "attachment", a.ID, "node", a.Node, "mode", a.Mode)
	}
	writeJSON(w, status, attachmentToAPI(a))
	return nil
}

func (s *Server) getAttachment(w http.ResponseWriter, r *http.Request) error {
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	a, err := v.Attachment(r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, attachmentToAPI(a))
	return nil
}

func (s *Server) detach(w http.ResponseWriter, r *http.Request) error {
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	if err := v.Detach(id); err != nil {
		return err
	}
	s.log.Info("detached", "volume", v.Name(), "attachment", id)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) transferWriter(w http.ResponseWriter, r *http.Request) error {
	var body struct{}
	if err := decode(r, &body); err != nil {
		return err
	}
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	a, err := v.Transfer(r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, attachmentToAPI(a))
	return nil
}
