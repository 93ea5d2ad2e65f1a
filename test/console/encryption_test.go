package console

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/nbdclient"
	"github.com/quiverstorage/quiver/internal/testserver"
)

// TestConsoleEncryption: an encrypted volume's page names its KEK and key
// provider as the API does; a deep rekey shows its progress as it runs,
// then as interrupted once its job is cancelled, and the new KEK once it is
// run again to the end: each read from the page, which reads the volume
// again every two seconds.
func TestConsoleEncryption(t *testing.T) {
	srv := testserver.StartT(t, quiverBin, testserver.Options{Token: adminToken,
		Args: []string{"--key-file", filepath.Join(t.TempDir(), "keys.json")}})
	ctx := context.Background()
	v, err := srv.API.CreateVolume(ctx, api.VolumeSpec{Name: "vault", Capacity: 128 << 20, Encrypt: true,
		Disks: []api.DiskSpec{{Name: "root", Size: 64 << 20}}})
	if err != nil {
		t.Fatal(err)
	}
	// Data all over the disk, so that the rekey has blocks to rewrite.
	att, err := srv.API.Attach(ctx, "vault", api.AttachmentSpec{Node: "host-a"})
	if err != nil {
		t.Fatal(err)
	}
	w, err := nbdclient.Dial(ctx, "", "vault/root/"+att.Token, nbdclient.Options{Timeout: 10 * time.Second,
		Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", srv.Socket)
		}})
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 256<<10)
	for i := range data {
		data[i] = byte(i*7 + 1)
	}
	for off := int64(0); off < 64<<20; off += 1 << 20 {
		if err := w.WriteAt(data, off, false); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if err := srv.API.Detach(ctx, "vault", att.ID); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, "http://"+srv.APIAddr)
	b.login(adminToken)
	b.goTo("#/volumes/vault", `[data-encryption]`)
	shown := func() string {
		return strings.TrimSpace(eval[string](b, `(document.querySelector('[data-encryption]') || {}).textContent || ''`))
	}
	waitFor := func(what string, ok func(string) bool) string {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			s := shown()
			if ok(s) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the page shows %q\npage errors: %v", what, s, b.pageErrors())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	want := fmt.Sprintf("XTS-AES-256, data key wrapped by KEK %s of %s", v.Encryption.KeyID, v.Encryption.Provider)
	if got := shown(); got != want {
		t.Fatalf("the page shows %q, want %q", got, want)
	}
	b.checkPage("volume-encrypted")

	// 64 MiB at 4 MiB/s: about 16 s, holes paced too.
	job, err := srv.API.StartRekey(ctx, "vault", api.RekeySpec{Deep: true, Rate: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	running := regexp.MustCompile(`; deep rekey ([0-9]+)% \(.* of 64\.0 MiB\), running$`)
	waitFor("a deep rekey running", func(s string) bool {
		m := running.FindStringSubmatch(s)
		return m != nil && m[1] != "0" && m[1] != "100" && strings.HasPrefix(s, want)
	})
	if _, err := srv.API.CancelJob(ctx, job.ID); err != nil {
		t.Fatal(err)
	}
	s := waitFor("the rekey interrupted", func(s string) bool { return strings.Contains(s, "interrupted: run quiver volume rekey --deep") })
	got, err := srv.API.GetVolume(ctx, "vault")
	if err != nil {
		t.Fatal(err)
	}
	r := got.Encryption.Rekey
	if r == nil || r.Running {
		t.Fatalf("the API after the cancel: %+v", r)
	}
	if pct := fmt.Sprintf("deep rekey %d%% ", 100*r.DoneBytes/r.TotalBytes); !strings.Contains(s, pct) {
		t.Fatalf("the page shows %q; the API's progress is %s", s, pct)
	}
	b.checkPage("volume-rekey-interrupted")

	after, err := srv.API.Rekey(ctx, "vault", api.RekeySpec{Deep: true, Rate: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	want = fmt.Sprintf("XTS-AES-256, data key wrapped by KEK %s of %s", after.Encryption.KeyID, after.Encryption.Provider)
	waitFor("the new KEK", func(s string) bool { return s == want })
}
