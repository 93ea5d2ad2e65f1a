package apiserver

import (
	"net/http"
	"strings"
	"testing"

	"github.com/quiverstorage/quiver/internal/api"
)

func TestAttachmentRoutes(t *testing.T) {
	c, p := startAPI(t, "")
	c.expect("POST", "/v1/volumes", api.VolumeSpec{Name: "vm", Capacity: 16 * mib,
		Disks: []api.DiskSpec{{Name: "root", Size: 4 * mib}, {Name: "quorum", Size: mib, Shared: true}}}, http.StatusCreated, nil)

	var src, again, dst api.Attachment
	c.expect("POST", "/v1/volumes/vm/attachments", api.AttachmentSpec{Node: "node-a"}, http.StatusCreated, &src)
	if src.ID == "" || len(src.Token) != 64 || src.Mode != api.ModeReadWrite || src.Volume != "vm" {
		t.Fatalf("attach: %+v", src)
	}
	c.expectError("POST", "/v1/volumes/vm/attachments", api.AttachmentSpec{Node: "node-a", Mode: "rw"}, http.StatusConflict, api.CodeConflict)
	c.expect("POST", "/v1/volumes/vm/attachments?idempotent=true", api.AttachmentSpec{Node: "node-a", Mode: "rw"}, http.StatusOK, &again)
	if again.ID != src.ID || again.Token != src.Token {
		t.Fatalf("idempotent attach returned %+v, want %+v", again, src)
	}
	c.expectError("POST", "/v1/volumes/vm/attachments?idempotent=true", api.AttachmentSpec{Node: "node-a", Mode: "ro"}, http.StatusConflict, api.CodeConflict)
	if e := c.expectError("POST", "/v1/volumes/vm/attachments", api.AttachmentSpec{Node: "Node A"}, http.StatusBadRequest, api.CodeInvalid); e.Field != "node" {
		t.Fatalf("bad node: field %q", e.Field)
	}
	if e := c.expectError("POST", "/v1/volumes/vm/attachments", api.AttachmentSpec{Node: "b", Mode: "rx"}, http.StatusBadRequest, api.CodeInvalid); e.Field != "mode" {
		t.Fatalf("bad mode: field %q", e.Field)
	}
	c.expectError("POST", "/v1/volumes/nope/attachments", api.AttachmentSpec{Node: "b"}, http.StatusNotFound, api.CodeNotFound)
	c.expect("POST", "/v1/volumes/vm/attachments", api.AttachmentSpec{Node: "node-b"}, http.StatusCreated, &dst)

	var list api.List[api.Attachment]
	c.expect("GET", "/v1/volumes/vm/attachments", nil, http.StatusOK, &list)
	if len(list.Items) != 2 || list.Items[0].ID != src.ID || list.Items[0].Token != "" {
		t.Fatalf("list (tokens must not show): %+v", list.Items)
	}
	var got api.Attachment
	c.expect("GET", "/v1/volumes/vm/attachments/"+dst.ID, nil, http.StatusOK, &got)
	if got.Node != "node-b" || got.Token != "" || got.Writer || got.Fenced {
		t.Fatalf("get: %+v", got)
	}
	c.expectError("GET", "/v1/volumes/vm/attachments/att-nope", nil, http.StatusNotFound, api.CodeNotFound)

	// The writer role moves with the API, and the volume reports it.
	var w api.Attachment
	c.expect("POST", "/v1/volumes/vm/attachments/"+dst.ID+"/writer", struct{}{}, http.StatusOK, &w)
	if !w.Writer || w.Fenced {
		t.Fatalf("transfer: %+v", w)
	}
	var vol api.Volume
	c.expect("GET", "/v1/volumes/vm", nil, http.StatusOK, &vol)
	if vol.Writer.Epoch != 1 || vol.Writer.Attachment != dst.ID || !vol.Disks[1].Shared {
		t.Fatalf("volume writer %+v, disks %+v", vol.Writer, vol.Disks)
	}
	c.expect("GET", "/v1/volumes/vm/attachments/"+src.ID, nil, http.StatusOK, &got)
	if !got.Fenced {
		t.Fatalf("old attachment not fenced after transfer: %+v", got)
	}
	c.expectError("POST", "/v1/volumes/vm/attachments/"+src.ID+"/writer", map[string]int{"epoch": 1}, http.StatusBadRequest, api.CodeInvalid)

	// An attached volume cannot be deleted; detached, it can.
	c.expectError("DELETE", "/v1/volumes/vm", nil, http.StatusConflict, api.CodeInUse)
	for _, a := range []api.Attachment{src, dst} {
		c.expect("DELETE", "/v1/volumes/vm/attachments/"+a.ID, nil, http.StatusNoContent, nil)
	}
	c.expectError("DELETE", "/v1/volumes/vm/attachments/"+src.ID, nil, http.StatusNotFound, api.CodeNotFound)
	v, err := p.Volume("vm")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.AttachmentByToken(src.Token); err == nil {
		t.Fatal("token of a detached attachment still accepted")
	}
	c.expect("DELETE", "/v1/volumes/vm", nil, http.StatusNoContent, nil)
}

// TestDestructiveRoutesRefuseConnectedWriters: rollback (sync and async) and
// disk removal answer 409 InUse while a writer is connected, before any job
// starts; ?force=true goes ahead; a bad force value is 400.
func TestDestructiveRoutesRefuseConnectedWriters(t *testing.T) {
	c, p := startAPI(t, "")
	c.expect("POST", "/v1/volumes", api.VolumeSpec{Name: "vm", Capacity: 16 * mib,
		Disks: []api.DiskSpec{{Name: "root", Size: 4 * mib}, {Name: "data", Size: mib}}}, http.StatusCreated, nil)
	c.expect("POST", "/v1/volumes/vm/snapshots", api.SnapshotSpec{Name: "s"}, http.StatusCreated, nil)
	v, err := p.Volume("vm")
	if err != nil {
		t.Fatal(err)
	}
	d, _, err := v.OpenImplicit("127.0.0.1:1", "root") // a tokenless writer, connected
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, path := range []string{"/v1/volumes/vm/rollback", "/v1/volumes/vm/rollback?async=true"} {
		e := c.expectError("POST", path, api.RollbackSpec{Snapshot: "s"}, http.StatusConflict, api.CodeInUse)
		if !strings.Contains(e.Message, "force") {
			t.Errorf("%s: message %q does not say how to force it", path, e.Message)
		}
	}
	c.expectError("DELETE", "/v1/volumes/vm/disks/data", nil, http.StatusConflict, api.CodeInUse)
	c.expectError("DELETE", "/v1/volumes/vm/disks/data?force=yes", nil, http.StatusBadRequest, api.CodeInvalid)
	var jobs api.List[api.Job]
	c.expect("GET", "/v1/jobs", nil, http.StatusOK, &jobs)
	for _, j := range jobs.Items {
		if j.Kind == "rollback" {
			t.Errorf("a refused rollback started job %+v", j)
		}
	}
	c.expect("POST", "/v1/volumes/vm/rollback?force=true", api.RollbackSpec{Snapshot: "s"}, http.StatusOK, nil)
	c.expect("DELETE", "/v1/volumes/vm/disks/data?force=true", nil, http.StatusOK, nil)
}
