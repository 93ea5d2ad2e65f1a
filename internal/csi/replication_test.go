package csi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
	addonsid "github.com/quiverstorage/quiver/internal/csiaddons/identity"
	"github.com/quiverstorage/quiver/internal/csiaddons/replication"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// relay is an HTTP proxy on loopback to an address set once the server
// behind it runs: two DR sites name each other before either has a port.
type relay struct {
	srv *httptest.Server
	to  atomic.Pointer[url.URL]
}

func newRelay(t *testing.T) *relay {
	r := &relay{}
	r.srv = httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(r.to.Load()) }})
	t.Cleanup(r.srv.Close)
	return r
}

// drSites starts two servers, a and b, each naming the other as a DR site,
// and a plugin (all mode) on each.
func drSites(t *testing.T) (a, b *server, pa, pb *plugin) {
	t.Helper()
	dir := t.TempDir()
	tokens := map[string]string{"a": "site-a-admin-token-0123456789abcdef", "b": "site-b-admin-token-0123456789abcdef"}
	relays := map[string]*relay{"a": newRelay(t), "b": newRelay(t)}
	procs := map[string]*testserver.Process{}
	for site, other := range map[string]string{"a": "b", "b": "a"} {
		tokFile := filepath.Join(dir, other+".token")
		cfg, _ := json.Marshal(map[string]any{"sites": []map[string]any{{"name": other, "url": relays[other].srv.URL, "tokenFile": tokFile}}})
		cfgFile := filepath.Join(dir, site+".json")
		for f, data := range map[string][]byte{tokFile: []byte(tokens[other] + "\n"), cfgFile: cfg} {
			if err := os.WriteFile(f, data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		procs[site] = testserver.StartT(t, quiverBin, testserver.Options{Pool: filepath.Join(dir, site), Token: tokens[site],
			NBDSocket: testserver.SocketPath(t), Args: []string{"--dr-config", cfgFile}})
		relays[site].to.Store(&url.URL{Scheme: "http", Host: procs[site].APIAddr})
	}
	srv := func(site string) *server {
		p := procs[site]
		return &server{apiURL: "http://" + p.APIAddr, nbdSocket: p.Socket, token: tokens[site], api: p.API, pool: p.Pool}
	}
	a, b = srv("a"), srv("b")
	return a, b, startPlugin(t, a, "node-a", true), startPlugin(t, b, "node-b", true)
}

func volumeSource(id string) *replication.ReplicationSource {
	return &replication.ReplicationSource{Type: &replication.ReplicationSource_Volume{
		Volume: &replication.ReplicationSource_VolumeSource{VolumeId: id}}}
}

// waitFor polls cond until it holds or 20 s pass.
func waitFor(t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ok, err := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20 s (last error: %v)", what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// lastSeq is the newest point's sequence number of relationship rel's
// target on the server of qc, 0 for none.
func lastSeq(ctx context.Context, qc *client.Client, rel string) (uint64, error) {
	tg, err := qc.DRTarget(ctx, rel)
	if err != nil || len(tg.Points) == 0 {
		return 0, err
	}
	return tg.Points[len(tg.Points)-1].Seq, nil
}

// TestReplicationService drives the csi-addons Replication service of two
// plugins, each on its own site, as Ramen would: enable on A ships points to
// B by themselves; the info reports the last point's time; a resync ships
// one now; a planned failover demotes A and promotes B, which then ships
// back to A; disable ends B's policy. Bad requests get their gRPC codes and
// change nothing.
func TestReplicationService(t *testing.T) {
	a, b, pa, pb := drSites(t)
	ctx := t.Context()
	ra, rb := replication.NewControllerClient(pa.conn), replication.NewControllerClient(pb.conn)

	caps, err := addonsid.NewIdentityClient(pa.conn).GetCapabilities(ctx, &addonsid.GetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	advertised := false
	for _, c := range caps.GetCapabilities() {
		advertised = advertised || c.GetVolumeReplication().GetType() == addonsid.Capability_VolumeReplication_VOLUME_REPLICATION
	}
	if !advertised {
		t.Fatalf("csi-addons capabilities %v: no VOLUME_REPLICATION", caps.GetCapabilities())
	}

	// A PV's name is longer than a relationship's 30 characters.
	const pvc = "pvc-3f0c9a52-6d1e-4c0b-9a7e-2b51c8e0d4aa"
	created, err := pa.ctrl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: pvc,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: 8 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}})
	if err != nil {
		t.Fatal(err)
	}
	vol := created.GetVolume().GetVolumeId() // kept: it ends holding points, which DeleteVolume refuses
	src := volumeSource(vol)
	toB := map[string]string{ParamSite: "b", ParamSchedulingInterval: "1m"}

	// Bad requests.
	enable := func(src *replication.ReplicationSource, params map[string]string) error {
		_, err := ra.EnableVolumeReplication(ctx, &replication.EnableVolumeReplicationRequest{ReplicationSource: src, Parameters: params})
		return err
	}
	wantCode(t, "enable without a source", enable(nil, toB), codes.InvalidArgument, "replication_source")
	wantCode(t, "enable of an unknown volume", enable(volumeSource("pvc-nope"), toB), codes.NotFound, "pvc-nope")
	wantCode(t, "enable of a volume group", enable(&replication.ReplicationSource{Type: &replication.ReplicationSource_Volumegroup{
		Volumegroup: &replication.ReplicationSource_VolumeGroupSource{VolumeGroupId: "g"}}}, toB), codes.Unimplemented, "volume group")
	wantCode(t, "enable without a site", enable(src, map[string]string{ParamSchedulingInterval: "1m"}), codes.InvalidArgument, "site")
	wantCode(t, "enable without an interval", enable(src, map[string]string{ParamSite: "b"}), codes.InvalidArgument, "schedulingInterval")
	wantCode(t, "enable to an unknown site", enable(src, map[string]string{ParamSite: "c", ParamSchedulingInterval: "1m"}), codes.InvalidArgument, "its sites: b")
	wantCode(t, "enable with a bad interval", enable(src, map[string]string{ParamSite: "b", ParamSchedulingInterval: "soon"}), codes.InvalidArgument, "soon")
	wantCode(t, "enable with a misspelt key", enable(src, map[string]string{ParamSite: "b", "rpO": "1m"}), codes.InvalidArgument, "rpO")
	wantCode(t, "enable with an RPO below the server's 10 s", enable(src, map[string]string{ParamSite: "b", ParamRPO: "1s"}), codes.InvalidArgument, "rpo")
	_, err = ra.GetVolumeReplicationInfo(ctx, &replication.GetVolumeReplicationInfoRequest{ReplicationSource: src})
	wantCode(t, "info before enable", err, codes.FailedPrecondition, "no DR policy")
	_, err = ra.ResyncVolume(ctx, &replication.ResyncVolumeRequest{ReplicationSource: src})
	wantCode(t, "resync before enable", err, codes.FailedPrecondition, "no DR policy")
	_, err = ra.PromoteVolume(ctx, &replication.PromoteVolumeRequest{ReplicationSource: volumeSource("pvc-nope")})
	wantCode(t, "promote of an unknown volume", err, codes.NotFound, "pvc-nope")
	if v, err := a.api.GetVolume(ctx, vol); err != nil || v.DRPolicy != nil {
		t.Fatalf("after the bad requests: %+v, %v; want no DR policy", v.DRPolicy, err)
	}

	// B accepts the relationship into a volume of the same name (the PV's
	// handle is the same on both sites); A enables it.
	rel := mapName(pvc, maxRelationship)
	if _, err := b.api.DRAccept(ctx, api.DRAccept{Relationship: rel, Volume: vol}); err != nil {
		t.Fatal(err)
	}
	enabled := time.Now()
	for range 2 { // idempotent
		if err := enable(src, toB); err != nil {
			t.Fatalf("enable: %v", err)
		}
	}
	if v, _ := a.api.GetVolume(ctx, vol); v.DRPolicy == nil || *v.DRPolicy != (api.DRPolicy{Site: "b", Relationship: rel, RPO: "1m0s"}) {
		t.Fatalf("A's DR policy after enable: %+v", v.DRPolicy)
	}
	waitFor(t, "B holds a point", func() (bool, error) { s, err := lastSeq(ctx, b.api, rel); return s > 0, err })

	var info *replication.GetVolumeReplicationInfoResponse
	waitFor(t, "info reports the point", func() (bool, error) {
		info, err = ra.GetVolumeReplicationInfo(ctx, &replication.GetVolumeReplicationInfoRequest{ReplicationSource: src})
		return err == nil && info.GetStatus() == replication.GetVolumeReplicationInfoResponse_HEALTHY, err
	})
	tg, err := b.api.DRTarget(ctx, rel)
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := a.api.ListSnapshots(ctx, vol)
	if err != nil {
		t.Fatal(err)
	}
	var pointAt time.Time
	for _, s := range snaps {
		if s.Name == tg.Points[len(tg.Points)-1].Snapshot {
			pointAt = s.CreatedAt
		}
	}
	if st := info.GetLastSyncTime(); st == nil || !st.AsTime().Equal(pointAt) || pointAt.Before(enabled.Add(-time.Second)) {
		t.Errorf("last sync time %v, want the time of A's snapshot of B's last point (%v)", st.AsTime(), pointAt)
	}
	if info.GetLastSyncDuration().AsDuration() <= 0 {
		t.Errorf("last sync duration %v, want the cycle's", info.GetLastSyncDuration())
	}

	// A resync ships a point now.
	before, _ := lastSeq(ctx, b.api, rel)
	if r, err := ra.ResyncVolume(ctx, &replication.ResyncVolumeRequest{ReplicationSource: src}); err != nil || !r.GetReady() {
		t.Fatalf("resync on A: %v, %v", r, err)
	}
	if after, err := lastSeq(ctx, b.api, rel); err != nil || after <= before {
		t.Fatalf("B's last point after a resync: %d (before %d), %v", after, before, err)
	}

	// B is the secondary: enable does nothing there, a resync says it is
	// ready (it holds a point), the info is A's to give.
	toA := map[string]string{ParamSite: "a", ParamSchedulingInterval: "1m"}
	if _, err := rb.EnableVolumeReplication(ctx, &replication.EnableVolumeReplicationRequest{ReplicationSource: src, Parameters: toA}); err != nil {
		t.Fatalf("enable on the secondary: %v", err)
	}
	if r, err := rb.ResyncVolume(ctx, &replication.ResyncVolumeRequest{ReplicationSource: src}); err != nil || !r.GetReady() {
		t.Fatalf("resync on the secondary: %v, %v", r, err)
	}
	_, err = rb.GetVolumeReplicationInfo(ctx, &replication.GetVolumeReplicationInfoRequest{ReplicationSource: src})
	wantCode(t, "info on the secondary", err, codes.FailedPrecondition, "secondary")

	// A planned failover: A demoted, B promoted, and B ships to A.
	common, _ := lastSeq(ctx, b.api, rel)
	for range 2 {
		if _, err := ra.DemoteVolume(ctx, &replication.DemoteVolumeRequest{ReplicationSource: src, Parameters: toB}); err != nil {
			t.Fatalf("demote on A: %v", err)
		}
	}
	if v, _ := a.api.GetVolume(ctx, vol); v.DRPolicy != nil || v.Labels[drRelationshipLabel] != rel {
		t.Fatalf("A after demote: policy %+v, labels %v; want the target of %s", v.DRPolicy, v.Labels, rel)
	}
	for range 2 {
		if _, err := rb.PromoteVolume(ctx, &replication.PromoteVolumeRequest{ReplicationSource: src, Parameters: toA, Force: true}); err != nil {
			t.Fatalf("promote on B: %v", err)
		}
	}
	if v, _ := b.api.GetVolume(ctx, vol); v.Labels[drRelationshipLabel] != "" || v.DRPolicy == nil || v.DRPolicy.Site != "a" {
		t.Fatalf("B after promote: policy %+v, labels %v; want a source shipping to a", v.DRPolicy, v.Labels)
	}
	// A holds B's last point already, so B's scheduler waits for half the
	// RPO: a resync ships B's next point to A now.
	if r, err := rb.ResyncVolume(ctx, &replication.ResyncVolumeRequest{ReplicationSource: src}); err != nil || !r.GetReady() {
		t.Fatalf("resync on B: %v, %v", r, err)
	}
	if s, err := lastSeq(ctx, a.api, rel); err != nil || s <= common {
		t.Fatalf("A's last point after B's resync: %d (the common one %d), %v", s, common, err)
	}
	waitFor(t, "info on B reports its point", func() (bool, error) {
		info, err = rb.GetVolumeReplicationInfo(ctx, &replication.GetVolumeReplicationInfoRequest{ReplicationSource: src})
		return err == nil && info.GetLastSyncTime() != nil && info.GetStatus() == replication.GetVolumeReplicationInfoResponse_HEALTHY, err
	})

	// Disable ends B's policy; a second disable has nothing to do.
	for range 2 {
		if _, err := rb.DisableVolumeReplication(ctx, &replication.DisableVolumeReplicationRequest{ReplicationSource: src}); err != nil {
			t.Fatalf("disable on B: %v", err)
		}
	}
	if v, _ := b.api.GetVolume(ctx, vol); v.DRPolicy != nil {
		t.Fatalf("B's DR policy after disable: %+v", v.DRPolicy)
	}
}

// TestReplicationParams: a VolumeReplicationClass's parameters as the
// service reads them, and the relationship's default name.
func TestReplicationParams(t *testing.T) {
	const long = "pvc-3f0c9a52-6d1e-4c0b-9a7e-2b51c8e0d4aa"
	cases := []struct {
		params  map[string]string
		volume  string
		want    replicationParams
		wantErr bool
	}{
		{map[string]string{"site": "b", "schedulingInterval": "5m"}, "vm1", replicationParams{"b", "vm1", "5m0s"}, false},
		{map[string]string{"site": "b", "schedulingInterval": "1d"}, "vm1", replicationParams{"b", "vm1", "24h0m0s"}, false},
		{map[string]string{"site": "b", "rpo": "90s", "relationship": "db"}, "vm1", replicationParams{"b", "db", "1m30s"}, false},
		{map[string]string{"rpo": "1h", "schedulingInterval": "1h"}, "vm1", replicationParams{"", "vm1", "1h0m0s"}, false},
		// An orchestrator's own (prefixed) keys are left to it.
		{map[string]string{"site": "b", "replication.storage.openshift.io/x": "y"}, "vm1", replicationParams{"b", "vm1", ""}, false},
		{map[string]string{"site": "b"}, long, replicationParams{"b", mapName(long, maxRelationship), ""}, false},
		{map[string]string{"rpo": "1h", "schedulingInterval": "2h"}, "vm1", replicationParams{}, true},
		{map[string]string{"schedulingInterval": "0d"}, "vm1", replicationParams{}, true},
		{map[string]string{"schedulingInterval": "-5m"}, "vm1", replicationParams{}, true},
		{map[string]string{"relationship": "Not_A_Label"}, "vm1", replicationParams{}, true},
		{map[string]string{"relationship": strings.Repeat("r", 31)}, "vm1", replicationParams{}, true},
		{map[string]string{"mirroringMode": "snapshot"}, "vm1", replicationParams{}, true},
	}
	for _, c := range cases {
		got, err := parseReplicationParams(c.params, c.volume)
		if c.wantErr {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%v: %v, want ErrInvalid", c.params, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%v: %+v, %v; want %+v", c.params, got, err, c.want)
		}
	}
	if rel := mapName(long, maxRelationship); len(rel) > maxRelationship || !isDNSLabel(rel) || !strings.HasPrefix(rel, "pvc-") {
		t.Errorf("the default relationship of %s: %q", long, rel)
	}
}

// TestReplicationInfoStatus: a relationship's status as csi-addons
// reports it.
func TestReplicationInfoStatus(t *testing.T) {
	at := time.Date(2026, 12, 7, 1, 0, 0, 0, time.UTC)
	cases := []struct {
		st   api.DRStatus
		want replication.GetVolumeReplicationInfoResponse_Status
	}{
		{api.DRStatus{LastPoint: "p", LastPointAt: at, RPO: "1m0s"}, replication.GetVolumeReplicationInfoResponse_HEALTHY},
		{api.DRStatus{LastPoint: "p", LastPointAt: at, Missed: true}, replication.GetVolumeReplicationInfoResponse_DEGRADED},
		{api.DRStatus{LastPoint: "p", LastPointAt: at, LastError: "target gone"}, replication.GetVolumeReplicationInfoResponse_DEGRADED},
		{api.DRStatus{}, replication.GetVolumeReplicationInfoResponse_UNKNOWN},
	}
	for _, c := range cases {
		got := replicationInfo(c.st)
		if got.GetStatus() != c.want || got.GetStatusMessage() == "" {
			t.Errorf("%+v: %v %q, want %v with a message", c.st, got.GetStatus(), got.GetStatusMessage(), c.want)
		}
		if c.st.LastPointAt.IsZero() != (got.GetLastSyncTime() == nil) ||
			(got.GetLastSyncTime() != nil && !got.GetLastSyncTime().AsTime().Equal(c.st.LastPointAt)) {
			t.Errorf("%+v: last sync time %v", c.st, got.GetLastSyncTime())
		}
	}
}
