package apiserver

import (
	"context"
	"net/http"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/pool"
)

// TestAsyncBusyIsImmediate: an operation answered by a job is refused at
// once with 409 Busy, and starts no job, when what it needs is held by
// another operation: the volume (snapshot, rollback), a clone's source, or
// a clone's name.
func TestAsyncBusyIsImmediate(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		hold func(t *testing.T, p *pool.Pool) func()
		path string
		body any
	}{
		{"snapshot of a busy volume", holdVolume("web"), "/v1/volumes/web/snapshots", api.SnapshotSpec{Name: "s2"}},
		{"rollback of a busy volume", holdVolume("web"), "/v1/volumes/web/rollback", api.RollbackSpec{Snapshot: "base"}},
		{"clone of a busy volume", holdVolume("web"), "/v1/clones",
			api.CloneSpec{Source: api.Source{Volume: "web"}, Names: []string{"c1"}}},
		{"clone of a busy volume's snapshot", holdVolume("web"), "/v1/clones",
			api.CloneSpec{Source: api.Source{Volume: "web", Snapshot: "base"}, Names: []string{"c1"}}},
		{"clone to a name being created", func(t *testing.T, p *pool.Pool) func() {
			h, err := p.HoldClone(pool.CloneRequest{Source: pool.Source{Volume: "db"}, Names: []string{"c1"}})
			if err != nil {
				t.Fatal(err)
			}
			return h.Release
		}, "/v1/clones", api.CloneSpec{Source: api.Source{Volume: "web", Snapshot: "base"}, Names: []string{"c0", "c1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, p := startAPI(t, "")
			for _, name := range []string{"web", "db"} {
				if _, _, err := p.Create(ctx, pool.VolumeSpec{Name: name, Capacity: 4 * mib,
					Disks: []pool.DiskSpec{{Name: "root", Size: mib}}}); err != nil {
					t.Fatal(err)
				}
			}
			web, _ := p.Volume("web")
			if _, _, err := web.CreateSnapshot(ctx, "base", nil); err != nil {
				t.Fatal(err)
			}
			release := tc.hold(t, p)
			for _, q := range []string{"?async=true", ""} {
				c.expectError("POST", tc.path+q, tc.body, http.StatusConflict, api.CodeBusy)
			}
			var jobs api.List[api.Job]
			c.expect("GET", "/v1/jobs", nil, http.StatusOK, &jobs)
			if len(jobs.Items) != 0 {
				t.Fatalf("a refused request started jobs: %+v", jobs.Items)
			}
			release()
			var j api.Job
			c.expect("POST", tc.path+"?async=true", tc.body, http.StatusAccepted, &j)
			if got := c.waitJob(j.ID); got.State != api.JobSucceeded {
				t.Fatalf("once released: job %+v", got)
			}
		})
	}
}

func holdVolume(name string) func(t *testing.T, p *pool.Pool) func() {
	return func(t *testing.T, p *pool.Pool) func() {
		v, err := p.Volume(name)
		if err != nil {
			t.Fatal(err)
		}
		h, err := v.Hold("test")
		if err != nil {
			t.Fatal(err)
		}
		return h.Release
	}
}
