package apiserver

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/client"
)

// TestCreateOfATakenName: every create route answers 409 AlreadyExists,
// with a message saying what to do, for a name that is taken, even by an
// object of the same spec (issue 14: a nightly snapshot job reusing a name
// kept the first night's data). A retry with the Idempotency-Key the object
// was made with gets the object (200); another key or none does not; with
// ?idempotent=true the same spec is enough. The async snapshot answers the
// 409 itself instead of starting a job that fails.
func TestCreateOfATakenName(t *testing.T) {
	ctx := context.Background()
	s, _ := newTestAPI(t, "")
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	c, err := client.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateVolume(ctx, api.VolumeSpec{Name: "src", Capacity: 8 * mib,
		Disks: []api.DiskSpec{{Name: "root", Size: mib}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSnapshot(ctx, "src", "base"); err != nil {
		t.Fatal(err)
	}
	routes := []struct {
		name   string
		create func(opts ...client.CallOption) (string, error) // the object's identity
	}{
		{"volume", func(opts ...client.CallOption) (string, error) {
			v, err := c.CreateVolume(ctx, api.VolumeSpec{Name: "web01", Capacity: 8 * mib,
				Disks: []api.DiskSpec{{Name: "root", Size: mib}}}, opts...)
			return v.UID, err
		}},
		{"snapshot", func(opts ...client.CallOption) (string, error) {
			sn, err := c.CreateSnapshot(ctx, "src", "nightly", opts...)
			return sn.UID, err
		}},
		{"async snapshot", func(opts ...client.CallOption) (string, error) {
			j, err := c.StartSnapshot(ctx, "src", "weekly", opts...)
			if err != nil {
				return "", err
			}
			if _, err := c.WaitJob(ctx, j.ID, time.Millisecond, nil); err != nil {
				return "", err
			}
			sn, err := c.GetSnapshot(ctx, "src", "weekly")
			return sn.UID, err
		}},
		{"clone", func(opts ...client.CallOption) (string, error) {
			vs, err := c.Clone(ctx, api.CloneSpec{Source: api.Source{Volume: "src", Snapshot: "base"}, Names: []string{"vdi-1"}}, opts...)
			if err != nil {
				return "", err
			}
			return vs[0].UID, nil
		}},
		{"disk", func(opts ...client.CallOption) (string, error) {
			v, err := c.AddDisk(ctx, "src", api.DiskSpec{Name: "logs", Size: mib}, opts...)
			return v.Name + "/" + strings.Join(diskNames(v.Disks), ","), err
		}},
		{"attachment", func(opts ...client.CallOption) (string, error) {
			a, err := c.Attach(ctx, "src", api.AttachmentSpec{Node: "worker-2"}, opts...)
			return a.ID + a.Token, err
		}},
	}
	for _, r := range routes {
		t.Run(r.name, func(t *testing.T) {
			first, err := r.create(client.IdempotencyKey("key-a"))
			if err != nil {
				t.Fatal(err)
			}
			for _, tc := range []struct {
				what string
				opts []client.CallOption
			}{{"no key", nil}, {"another key", []client.CallOption{client.IdempotencyKey("key-b")}}} {
				_, err := r.create(tc.opts...)
				if !client.IsConflict(err) || !strings.Contains(err.Error(), "already") {
					t.Errorf("%s: %v, want a conflict saying the name is taken", tc.what, err)
				}
			}
			for _, opts := range [][]client.CallOption{{client.IdempotencyKey("key-a")}, {client.IdempotentCreate()}} {
				if again, err := r.create(opts...); err != nil || again != first {
					t.Errorf("retry: %q, %v; want the existing %q", again, err, first)
				}
			}
		})
	}
	if _, err := c.CreateVolume(ctx, api.VolumeSpec{Name: "x", Capacity: mib}, client.IdempotencyKey(strings.Repeat("k", 257))); client.Code(err) != api.CodeInvalid {
		t.Errorf("a key of 257 characters: %v, want Invalid", err)
	}
}
