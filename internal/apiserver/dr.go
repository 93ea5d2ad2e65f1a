package apiserver

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/auth"
	"github.com/quiverstorage/quiver/internal/crypt"
	"github.com/quiverstorage/quiver/internal/dr"
	"github.com/quiverstorage/quiver/internal/job"
	"github.com/quiverstorage/quiver/internal/pool"
)

// DR (docs/dr.md): a site is the target of relationships (its volumes
// labelled dr.quiver.io/relationship, written by another site's source
// through the routes below), and ships its own volumes to the sites of its
// --dr-config. Every DR route is an admin's: a target's volume is
// overwritten by its source, and a point carries every byte of a VM.

// maxDRWrite bounds the body of one data write of a point.
const maxDRWrite = 4 << 20

func (s *Server) drTargets(r *http.Request) (*dr.Targets, error) {
	if principalOf(r).Tenant != "" {
		return nil, fmt.Errorf("DR is per site, for every tenant: a tenant's token cannot reach it: %w", auth.ErrForbidden)
	}
	if s.Cluster != nil {
		return nil, fmt.Errorf("DR on a cluster node is not built yet (docs/dr.md): %w", pool.ErrNotSupported)
	}
	if s.DRTargets == nil {
		return nil, fmt.Errorf("this server is no DR target: %w", pool.ErrNotSupported)
	}
	return s.DRTargets, nil
}

func drTargetToAPI(t dr.TargetInfo) api.DRTarget {
	out := api.DRTarget{Relationship: t.Relationship, Volume: t.Volume, Points: []api.DRPoint{}}
	for _, p := range t.Points {
		out.Points = append(out.Points, api.DRPoint{Seq: p.Seq, Snapshot: p.Snapshot})
	}
	return out
}

func (s *Server) listDRTargets(w http.ResponseWriter, r *http.Request) error {
	ts, err := s.drTargets(r)
	if err != nil {
		return err
	}
	out := api.List[api.DRTarget]{Items: []api.DRTarget{}}
	for _, t := range ts.List() {
		out.Items = append(out.Items, drTargetToAPI(t))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getDRTarget(w http.ResponseWriter, r *http.Request) error {
	ts, err := s.drTargets(r)
	if err != nil {
		return err
	}
	t, err := ts.Get(r.PathValue("relationship"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, drTargetToAPI(t))
	return nil
}

func (s *Server) acceptDRTarget(w http.ResponseWriter, r *http.Request) error {
	ts, err := s.drTargets(r)
	if err != nil {
		return err
	}
	var spec api.DRAccept
	if err := decode(r, &spec); err != nil {
		return err
	}
	t, err := ts.Accept(r.Context(), spec.Relationship, spec.Volume)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, drTargetToAPI(t))
	return nil
}

func (s *Server) promoteDRTarget(w http.ResponseWriter, r *http.Request) error {
	ts, err := s.drTargets(r)
	if err != nil {
		return err
	}
	info, err := ts.Promote(r.Context(), r.PathValue("relationship"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, viewOf(r).volume(volumeToAPI(info)))
	return nil
}

func (s *Server) demoteDR(w http.ResponseWriter, r *http.Request) error {
	ts, err := s.drTargets(r)
	if err != nil {
		return err
	}
	var spec api.DRDemote
	if err := decode(r, &spec); err != nil {
		return err
	}
	if _, err := s.volume(r); err != nil { // the caller's name, checked as every volume route does
		return err
	}
	t, err := ts.Demote(r.Context(), spec.Relationship, r.PathValue("volume"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, drTargetToAPI(t))
	return nil
}

func (s *Server) drReceiver(r *http.Request) (*dr.Receiver, error) {
	ts, err := s.drTargets(r)
	if err != nil {
		return nil, err
	}
	return ts.Receiver(r.PathValue("relationship"))
}

func (s *Server) beginDRPoint(w http.ResponseWriter, r *http.Request) error {
	rcv, err := s.drReceiver(r)
	if err != nil {
		return err
	}
	var spec api.DRBegin
	if err := decode(r, &spec); err != nil {
		return err
	}
	var base *dr.Point
	if spec.Base != nil {
		base = &dr.Point{Seq: spec.Base.Seq, Snapshot: spec.Base.Snapshot}
	}
	var disks []pool.DiskSpec
	for i, d := range spec.Disks {
		if err := pool.ValidateName(fmt.Sprintf("disks[%d].name", i), d.Name); err != nil {
			return err
		}
		if err := pool.ValidateSize(fmt.Sprintf("disks[%d].size", i), d.Size); err != nil {
			return err
		}
		disks = append(disks, pool.DiskSpec{Name: d.Name, Size: d.Size, Shared: d.Shared})
	}
	start := dr.Start{Point: dr.Point{Seq: spec.Point.Seq, Snapshot: spec.Point.Snapshot}, Base: base, Disks: disks, Replace: spec.Replace}
	if k := spec.Key; k != nil { // checked by the pool (AdoptKey)
		start.Key = &crypt.WrappedKey{Provider: k.Provider, KeyID: k.KeyID, Algorithm: k.Algorithm, Wrapped: k.Wrapped}
		start.KeyUID = k.KeyUID
	}
	if err := rcv.Begin(r.Context(), start); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) writeDRData(w http.ResponseWriter, r *http.Request) error {
	rcv, err := s.drReceiver(r)
	if err != nil {
		return err
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/octet-stream") {
		return &badRequest{msg: fmt.Sprintf("Content-Type %q: must be application/octet-stream", ct)}
	}
	off, err := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
	if err != nil || off < 0 {
		return &badRequest{msg: "offset: want a byte offset"}
	}
	data, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxDRWrite))
	if err != nil {
		return &badRequest{msg: fmt.Sprintf("body: at most %d bytes: %v", maxDRWrite, err)}
	}
	if err := rcv.Write(r.Context(), r.PathValue("disk"), off, data); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) zeroDRData(w http.ResponseWriter, r *http.Request) error {
	rcv, err := s.drReceiver(r)
	if err != nil {
		return err
	}
	var z api.DRZero
	if err := decode(r, &z); err != nil {
		return err
	}
	if err := rcv.Zero(r.Context(), r.PathValue("disk"), z.Offset, z.Length); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) commitDRPoint(w http.ResponseWriter, r *http.Request) error {
	rcv, err := s.drReceiver(r)
	if err != nil {
		return err
	}
	var p api.DRPoint
	if err := decode(r, &p); err != nil {
		return err
	}
	if err := rcv.Commit(r.Context(), dr.Point{Seq: p.Seq, Snapshot: p.Snapshot}); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// The source's side.

func (s *Server) drSites(r *http.Request) (*dr.Sites, error) {
	if principalOf(r).Tenant != "" {
		return nil, fmt.Errorf("DR is per site, for every tenant: a tenant's token cannot reach it: %w", auth.ErrForbidden)
	}
	if s.DRSites == nil {
		return nil, fmt.Errorf("this server ships to no DR site: start it with --dr-config FILE (docs/dr.md): %w", dr.ErrNoSite)
	}
	return s.DRSites, nil
}

func (s *Server) listDRSites(w http.ResponseWriter, r *http.Request) error {
	sites, err := s.drSites(r)
	if err != nil {
		return err
	}
	out := api.List[api.DRSite]{Items: []api.DRSite{}}
	for _, sc := range sites.List() {
		out.Items = append(out.Items, api.DRSite{Name: sc.Name, URL: sc.URL})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) syncDR(w http.ResponseWriter, r *http.Request) error {
	sched, err := s.drScheduler(r)
	if err != nil {
		return err
	}
	var spec api.DRSync
	if err := decode(r, &spec); err != nil {
		return err
	}
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	site, rel := spec.Site, spec.Relationship
	if p := v.Info().DRPolicy; p != nil && site == "" && rel == "" {
		site, rel = p.Site, p.Relationship
	}
	if err := dr.ValidateRelationship(rel); err != nil {
		return err
	}
	if _, err := s.DRSites.Target(site, rel); err != nil {
		return err
	}
	var st dr.Stats
	return s.runJob(w, r, "dr-sync", v.Name()+"->"+site+"/"+rel, 1, func(ctx context.Context, j *job.Job) error {
		var err error
		if st, err = sched.Sync(ctx, v.Name(), site, rel, spec.Replace); err == nil {
			j.Done(st.Point.Snapshot)
		}
		return err
	}, func() error {
		writeJSON(w, http.StatusCreated, api.DRCycle{Point: api.DRPoint{Seq: st.Point.Seq, Snapshot: st.Point.Snapshot},
			Base: st.Base, Changed: st.Changed, Sent: st.Sent, Zeroed: st.Zeroed, Duration: st.Duration})
		return nil
	})
}

// drScheduler is the source's side of DR, refused for a tenant, without
// sites, and on a cluster.
func (s *Server) drScheduler(r *http.Request) (*dr.Scheduler, error) {
	if _, err := s.drSites(r); err != nil {
		return nil, err
	}
	if s.Cluster != nil {
		return nil, fmt.Errorf("DR of a cluster's volumes is not built yet (docs/dr.md): %w", pool.ErrNotSupported)
	}
	if s.DR == nil {
		return nil, fmt.Errorf("this server runs no DR scheduler: %w", dr.ErrNoSite)
	}
	return s.DR, nil
}

func (s *Server) setDRPolicy(w http.ResponseWriter, r *http.Request) error {
	if _, err := s.drScheduler(r); err != nil {
		return err
	}
	var p api.DRPolicy
	if err := decode(r, &p); err != nil {
		return err
	}
	rpo, err := time.ParseDuration(p.RPO)
	if err != nil {
		return fmt.Errorf("rpo %q: a duration such as 30s or 5m: %w", p.RPO, pool.ErrInvalid)
	}
	if err := dr.ValidateRelationship(p.Relationship); err != nil {
		return err
	}
	if _, err := s.DRSites.Target(p.Site, p.Relationship); err != nil {
		return err // an unknown site: said now, not at the first cycle
	}
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	if rel := v.Info().Labels[dr.RelationshipLabel]; rel != "" {
		return fmt.Errorf("volume %s is the DR target of relationship %s on this site: promote it first (quiver dr target promote %s): %w",
			v.Name(), rel, rel, pool.ErrInvalid)
	}
	info, err := v.SetDRPolicy(r.Context(), &pool.DRPolicy{Site: p.Site, Relationship: p.Relationship, RPO: rpo})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, viewOf(r).volume(volumeToAPI(info)))
	return nil
}

func (s *Server) deleteDRPolicy(w http.ResponseWriter, r *http.Request) error {
	if _, err := s.drScheduler(r); err != nil {
		return err
	}
	v, err := s.volume(r)
	if err != nil {
		return err
	}
	info, err := v.SetDRPolicy(r.Context(), nil)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, viewOf(r).volume(volumeToAPI(info)))
	return nil
}

func (s *Server) drStatus(w http.ResponseWriter, r *http.Request) error {
	sched, err := s.drScheduler(r)
	if err != nil {
		return err
	}
	now := time.Now()
	out := api.List[api.DRStatus]{Items: []api.DRStatus{}}
	for _, st := range sched.Statuses() {
		out.Items = append(out.Items, api.DRStatus{Volume: st.Volume, Site: st.Site, Relationship: st.Relationship,
			RPO: st.RPO.String(), LastPoint: st.LastPoint, LastPointAt: st.LastPointAt, Lag: st.Lag(now), Missed: st.Missed(now),
			Running: st.Running, LastAttempt: st.LastAttempt, LastError: st.LastError, LastSent: st.LastSent,
			LastChanged: st.LastChanged, LastTook: st.LastTook, Cycles: st.Cycles, Failures: st.Failures, SentTotal: st.SentTotal})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
