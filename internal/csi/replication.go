package csi

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	"github.com/quiverstorage/quiver/internal/csiaddons/replication"
)

// The csi-addons Replication service (docs/dr.md, "csi-addons"): a DR
// orchestrator (Ramen, through the csi-addons sidecar) drives quiver's DR
// relationships per volume. The primary is the source of a relationship
// (a volume with a DR policy), the secondary its target on the other site
// (a volume labelled drRelationshipLabel). Both sites name the volume alike
// (the PV's volume handle), so the relationship's default name derives
// from the volume's.

// Parameters of a VolumeReplicationClass that the service reads.
const (
	// ParamSite names the DR site to ship to, one of the server's
	// --dr-config sites (required to enable).
	ParamSite = "site"
	// ParamRelationship names the relationship; default: the volume's
	// name, cut to 30 characters with a hash when longer.
	ParamRelationship = "relationship"
	// ParamRPO is the policy's RPO, a Go duration (30s, 5m).
	ParamRPO = "rpo"
	// ParamSchedulingInterval is Ramen's name for it: <n>m, <n>h or
	// <n>d (a Go duration is taken too). Taken as the RPO.
	ParamSchedulingInterval = "schedulingInterval"
)

// drRelationshipLabel marks a volume as the DR target of the relationship
// it names (set by the server: dr target accept, dr demote).
const drRelationshipLabel = "dr.quiver.io/relationship"

// maxRelationship is the longest relationship name the server takes.
const maxRelationship = 30

// replicationController is the csi-addons Replication service.
type replicationController struct {
	replication.UnimplementedControllerServer
	d *Driver
}

// replicationParams is a VolumeReplicationClass's parameters, checked.
type replicationParams struct {
	site, relationship, rpo string
}

// parseReplicationParams reads params for volume. Keys with a "/" are an
// orchestrator's own and ignored; any other unknown key is refused, so a
// misspelt one is not silently left at its default.
func parseReplicationParams(params map[string]string, volume string) (replicationParams, error) {
	p := replicationParams{site: params[ParamSite], relationship: params[ParamRelationship]}
	for k := range params {
		switch k {
		case ParamSite, ParamRelationship, ParamRPO, ParamSchedulingInterval:
		default:
			if !strings.Contains(k, "/") {
				return p, fmt.Errorf("parameter %q: unknown (want %s, %s, %s or %s): %w", k,
					ParamSite, ParamRelationship, ParamRPO, ParamSchedulingInterval, ErrInvalid)
			}
		}
	}
	if p.relationship == "" {
		p.relationship = mapName(volume, maxRelationship)
	} else if !isDNSLabel(p.relationship) || len(p.relationship) > maxRelationship {
		return p, fmt.Errorf("parameter %s %q: must be a DNS label of at most %d characters: %w",
			ParamRelationship, p.relationship, maxRelationship, ErrInvalid)
	}
	var rpos []time.Duration
	for _, k := range []string{ParamRPO, ParamSchedulingInterval} {
		s, ok := params[k]
		if !ok {
			continue
		}
		d, err := parseInterval(s)
		if err != nil {
			return p, fmt.Errorf("parameter %s %q: %v: %w", k, s, err, ErrInvalid)
		}
		rpos = append(rpos, d)
	}
	if len(rpos) == 2 && rpos[0] != rpos[1] {
		return p, fmt.Errorf("parameters %s and %s differ: give one: %w", ParamRPO, ParamSchedulingInterval, ErrInvalid)
	}
	if len(rpos) > 0 {
		p.rpo = rpos[0].String()
	}
	return p, nil
}

// parseInterval reads a Go duration or Ramen's <n>d.
func parseInterval(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("want <n>m, <n>h or <n>d")
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("want <n>m, <n>h or <n>d")
	}
	return d, nil
}

// sourceVolume reads the volume of a request's replication source.
func sourceVolume(src *replication.ReplicationSource) (string, error) {
	if src == nil {
		return "", fmt.Errorf("replication_source is required: %w", ErrInvalid)
	}
	if src.GetVolumegroup() != nil {
		return "", fmt.Errorf("replication_source.volumegroup: quiver replicates a VM's disks as one volume; volume groups: %w", ErrUnimplemented)
	}
	return parseVolumeID("replication_source.volume.volume_id", src.GetVolume().GetVolumeId())
}

// replicationVolume checks a request's source, takes the volume's lock and
// looks it up; call the returned function to release the lock.
func (r *replicationController) replicationVolume(ctx context.Context, secrets map[string]string, src *replication.ReplicationSource) (*client.Client, api.Volume, func(), error) {
	name, err := sourceVolume(src)
	if err != nil {
		return nil, api.Volume{}, nil, err
	}
	return r.d.lockedVolume(ctx, secrets, name)
}

// ensurePolicy gives v the DR policy of p, unless it already has it.
func ensurePolicy(ctx context.Context, qc *client.Client, v api.Volume, p replicationParams) error {
	if p.site == "" {
		return fmt.Errorf("parameter %s is required: the DR site to ship to: %w", ParamSite, ErrInvalid)
	}
	if p.rpo == "" {
		return fmt.Errorf("parameter %s (or %s) is required: %w", ParamSchedulingInterval, ParamRPO, ErrInvalid)
	}
	want := api.DRPolicy{Site: p.site, Relationship: p.relationship, RPO: p.rpo}
	if v.DRPolicy != nil && *v.DRPolicy == want {
		return nil
	}
	sites, err := qc.DRSites(ctx)
	if err != nil {
		return fmt.Errorf("DR sites: %w", err)
	}
	if !slices.ContainsFunc(sites, func(s api.DRSite) bool { return s.Name == p.site }) {
		names := make([]string, 0, len(sites))
		for _, s := range sites {
			names = append(names, s.Name)
		}
		return fmt.Errorf("parameter %s %q: not a DR site of this quiver server (its sites: %s): %w",
			ParamSite, p.site, strings.Join(names, ", "), ErrInvalid)
	}
	if _, err := qc.SetDRPolicy(ctx, v.Name, want); err != nil {
		return fmt.Errorf("DR policy of volume %s: %w", v.Name, err)
	}
	return nil
}

// EnableVolumeReplication gives the volume its DR policy: the server's
// scheduler ships its points to the site's target of the relationship
// (which the target site accepts: quiver dr target accept). On a volume that
// is already the target of the relationship here (the secondary), it does
// nothing: the policy follows its promotion.
func (r *replicationController) EnableVolumeReplication(ctx context.Context, req *replication.EnableVolumeReplicationRequest) (*replication.EnableVolumeReplicationResponse, error) {
	qc, v, unlock, err := r.replicationVolume(ctx, req.GetSecrets(), req.GetReplicationSource())
	if err != nil {
		return nil, err
	}
	defer unlock()
	p, err := parseReplicationParams(req.GetParameters(), v.Name)
	if err != nil {
		return nil, err
	}
	if rel := v.Labels[drRelationshipLabel]; rel != "" {
		if rel != p.relationship {
			return nil, fmt.Errorf("volume %s is the DR target of relationship %s here, not of %s: %w",
				v.Name, rel, p.relationship, ErrPrecondition)
		}
		return &replication.EnableVolumeReplicationResponse{}, nil
	}
	if err := ensurePolicy(ctx, qc, v, p); err != nil {
		return nil, err
	}
	return &replication.EnableVolumeReplicationResponse{}, nil
}

// DisableVolumeReplication removes the volume's DR policy; the points on
// both sites stay, so a later enable ships only the delta. A volume
// without one (or a target) has nothing to disable.
func (r *replicationController) DisableVolumeReplication(ctx context.Context, req *replication.DisableVolumeReplicationRequest) (*replication.DisableVolumeReplicationResponse, error) {
	qc, v, unlock, err := r.replicationVolume(ctx, req.GetSecrets(), req.GetReplicationSource())
	if err != nil {
		return nil, err
	}
	defer unlock()
	if v.DRPolicy != nil {
		if _, err := qc.DeleteDRPolicy(ctx, v.Name); err != nil {
			return nil, fmt.Errorf("DR policy of volume %s: %w", v.Name, err)
		}
	}
	return &replication.DisableVolumeReplicationResponse{}, nil
}

// PromoteVolume promotes the volume when it is the DR target of a
// relationship here: it returns to its last point and becomes an ordinary
// volume. quiver's promote never asks the other site, so force changes
// nothing. With a site in the parameters, the promoted volume then ships
// back to it (its DR policy, as EnableVolumeReplication sets it). A volume
// that is no target is primary already.
func (r *replicationController) PromoteVolume(ctx context.Context, req *replication.PromoteVolumeRequest) (*replication.PromoteVolumeResponse, error) {
	qc, v, unlock, err := r.replicationVolume(ctx, req.GetSecrets(), req.GetReplicationSource())
	if err != nil {
		return nil, err
	}
	defer unlock()
	p, err := parseReplicationParams(req.GetParameters(), v.Name)
	if err != nil {
		return nil, err
	}
	if rel := v.Labels[drRelationshipLabel]; rel != "" {
		promoted, err := qc.DRPromote(ctx, rel)
		if err != nil {
			return nil, fmt.Errorf("promote the DR target %s of relationship %s: %w", v.Name, rel, err)
		}
		v = promoted
	}
	if p.site != "" {
		if err := ensurePolicy(ctx, qc, v, p); err != nil {
			return nil, err
		}
	}
	return &replication.PromoteVolumeResponse{}, nil
}

// DemoteVolume makes the volume, a source until now, the target of its
// relationship on this site (quiver dr demote): its DR policy ends and the
// other site's next cycle ships only what it changed since the newest point
// both hold. Refused while a VM holds it read-write, force or not. A volume
// that is the relationship's target already is done.
func (r *replicationController) DemoteVolume(ctx context.Context, req *replication.DemoteVolumeRequest) (*replication.DemoteVolumeResponse, error) {
	qc, v, unlock, err := r.replicationVolume(ctx, req.GetSecrets(), req.GetReplicationSource())
	if err != nil {
		return nil, err
	}
	defer unlock()
	p, err := parseReplicationParams(req.GetParameters(), v.Name)
	if err != nil {
		return nil, err
	}
	rel := p.relationship
	if v.DRPolicy != nil {
		rel = v.DRPolicy.Relationship
	}
	switch l := v.Labels[drRelationshipLabel]; {
	case l == rel:
		return &replication.DemoteVolumeResponse{}, nil
	case l != "":
		return nil, fmt.Errorf("volume %s is the DR target of relationship %s here, not of %s: %w", v.Name, l, rel, ErrPrecondition)
	}
	if _, err := qc.DRDemote(ctx, v.Name, rel); err != nil {
		return nil, fmt.Errorf("demote volume %s in relationship %s: %w", v.Name, rel, err)
	}
	return &replication.DemoteVolumeResponse{}, nil
}

// ResyncVolume on a secondary (a DR target) reports it ready once it holds
// a point to promote; on a primary it ships a point now and reports ready
// when the target committed it.
func (r *replicationController) ResyncVolume(ctx context.Context, req *replication.ResyncVolumeRequest) (*replication.ResyncVolumeResponse, error) {
	qc, v, unlock, err := r.replicationVolume(ctx, req.GetSecrets(), req.GetReplicationSource())
	if err != nil {
		return nil, err
	}
	defer unlock()
	if rel := v.Labels[drRelationshipLabel]; rel != "" {
		t, err := qc.DRTarget(ctx, rel)
		if err != nil {
			return nil, fmt.Errorf("DR target of relationship %s: %w", rel, err)
		}
		return &replication.ResyncVolumeResponse{Ready: len(t.Points) > 0}, nil
	}
	if v.DRPolicy == nil {
		return nil, fmt.Errorf("volume %s has no DR policy: enable its replication first: %w", v.Name, ErrPrecondition)
	}
	if _, err := qc.DRSync(ctx, v.Name, api.DRSync{}); err != nil {
		return nil, fmt.Errorf("DR sync of volume %s: %w", v.Name, err)
	}
	return &replication.ResyncVolumeResponse{Ready: true}, nil
}

// GetVolumeReplicationInfo reports a primary's last point: when the source
// took it, how long its cycle took and how many bytes it wrote (the last
// successful cycle's, unknown after a restart of the server), and whether
// the relationship holds its RPO.
func (r *replicationController) GetVolumeReplicationInfo(ctx context.Context, req *replication.GetVolumeReplicationInfoRequest) (*replication.GetVolumeReplicationInfoResponse, error) {
	name, err := sourceVolume(req.GetReplicationSource())
	if err != nil {
		return nil, err
	}
	qc, err := r.d.clientFor(req.GetSecrets())
	if err != nil {
		return nil, err
	}
	v, err := getVolume(ctx, qc, name)
	if err != nil {
		return nil, err
	}
	if rel := v.Labels[drRelationshipLabel]; rel != "" {
		return nil, fmt.Errorf("volume %s is the DR target (secondary) of relationship %s: its source reports the replication: %w",
			name, rel, ErrPrecondition)
	}
	if v.DRPolicy == nil {
		return nil, fmt.Errorf("volume %s has no DR policy: enable its replication first: %w", name, ErrPrecondition)
	}
	all, err := qc.DRStatus(ctx)
	if err != nil {
		return nil, fmt.Errorf("DR status: %w", err)
	}
	i := slices.IndexFunc(all, func(s api.DRStatus) bool { return s.Volume == name })
	if i < 0 {
		return &replication.GetVolumeReplicationInfoResponse{Status: replication.GetVolumeReplicationInfoResponse_UNKNOWN,
			StatusMessage: "the DR scheduler has not taken the policy up yet"}, nil
	}
	return replicationInfo(all[i]), nil
}

// replicationInfo is a relationship's status as csi-addons reports it.
func replicationInfo(st api.DRStatus) *replication.GetVolumeReplicationInfoResponse {
	out := &replication.GetVolumeReplicationInfoResponse{LastSyncBytes: st.LastSent}
	if !st.LastPointAt.IsZero() {
		out.LastSyncTime = timestamppb.New(st.LastPointAt)
	}
	if st.LastTook > 0 {
		out.LastSyncDuration = durationpb.New(st.LastTook)
	}
	switch {
	case st.LastError != "":
		out.Status = replication.GetVolumeReplicationInfoResponse_DEGRADED
		out.StatusMessage = "the last cycle failed: " + st.LastError
	case st.Missed:
		out.Status = replication.GetVolumeReplicationInfoResponse_DEGRADED
		out.StatusMessage = fmt.Sprintf("the target's last point is %s old, beyond the RPO of %s", st.Lag.Round(time.Second), st.RPO)
	case st.LastPoint == "":
		out.Status = replication.GetVolumeReplicationInfoResponse_UNKNOWN
		out.StatusMessage = "no point shipped yet"
	default:
		out.Status = replication.GetVolumeReplicationInfoResponse_HEALTHY
		out.StatusMessage = fmt.Sprintf("last point %s, %s old (RPO %s)", st.LastPoint, st.Lag.Round(time.Second), st.RPO)
	}
	return out
}
