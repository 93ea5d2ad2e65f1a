package drtest

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/consistency"
	"github.com/quiverstorage/quiver/internal/nbdclient"
	"github.com/quiverstorage/quiver/internal/testnet"
	"github.com/quiverstorage/quiver/internal/testserver"
	"github.com/quiverstorage/quiver/internal/tlscert/certtest"
)

// soak is how long TestTwoSitesHoldTheRPO writes and ships: the issue's
// ten minutes; QUIVER_DR_SOAK_MINUTES sets another length.
func soak(t *testing.T) time.Duration {
	if s := os.Getenv("QUIVER_DR_SOAK_MINUTES"); s != "" {
		m, err := strconv.ParseFloat(s, 64)
		if err != nil || m <= 0 {
			t.Fatalf("QUIVER_DR_SOAK_MINUTES=%q: want minutes", s)
		}
		return time.Duration(m * float64(time.Minute))
	}
	return 10 * time.Minute
}

// TestTwoSitesHoldTheRPO (issue 34, acceptance 1): two sites, each a
// server in its own network namespace, over HTTPS with its own token. Site
// A's 3-disk VM is written all along (four writers, each write stamped
// with a global sequence number in a block of its own, the disks taken
// round robin: internal/consistency), and replicates to site B with an
// RPO of one minute. For soak (ten minutes): the lag A reports never
// passes the RPO, points keep coming, and every point B commits, read
// back from B, is a consistent cut across the three disks (no write in it
// while a write acknowledged before that one began is missing).
func TestTwoSitesHoldTheRPO(t *testing.T) {
	length := soak(t)
	const rpo = time.Minute
	dir := t.TempDir()
	n := testnet.New(t, "10.79.0.", "qdr", "qd")
	nsA, ipA := n.AddNode(1)
	nsB, ipB := n.AddNode(2)
	ca := certtest.NewCA(t, "dr sites CA")
	caFile := filepath.Join(dir, "ca.pem")
	certtest.WriteFile(t, caFile, ca.PEM)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(ca.PEM)
	tlsCfg := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	tokFileB := filepath.Join(dir, "b.token")
	certtest.WriteFile(t, tokFileB, []byte(tokenB+"\n"))
	cfg, _ := json.Marshal(map[string]any{"sites": []map[string]any{{"name": "b", "url": "https://" + ipB + ":7480",
		"tokenFile": tokFileB, "caFile": caFile}}})
	cfgFile := filepath.Join(dir, "dr.json")
	certtest.WriteFile(t, cfgFile, cfg)
	start := func(name, ns, ip, token string, more ...string) *testserver.Process {
		pair := ca.Server(t, false, ip)
		if err := os.MkdirAll(filepath.Join(dir, name), 0o700); err != nil {
			t.Fatal(err)
		}
		cert, key := pair.Write(t, filepath.Join(dir, name))
		return testserver.StartT(t, bin, testserver.Options{Pool: filepath.Join(dir, name, "pool"), Token: token,
			Args: append([]string{"--listen", ip + ":7480", "--nbd-listen", ip + ":10809", "--tls-cert", cert, "--tls-key", key}, more...),
			Wrap: []string{"ip", "netns", "exec", ns}, Dial: n.Dial, TLS: tlsCfg})
	}
	b := start("b", nsB, ipB, tokenB)
	a := start("a", nsA, ipA, tokenA, "--dr-config", cfgFile)
	ctx := context.Background()

	const diskSize = 64 << 20
	if _, err := a.API.CreateVolume(ctx, api.VolumeSpec{Name: "vm", Capacity: 3 * diskSize,
		Disks: []api.DiskSpec{{Name: "d0", Size: diskSize}, {Name: "d1", Size: diskSize}, {Name: "d2", Size: diskSize}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.API.DRAccept(ctx, api.DRAccept{Relationship: "db", Volume: "vm-dr"}); err != nil {
		t.Fatal(err)
	}
	att, err := a.API.Attach(ctx, "vm", api.AttachmentSpec{Node: "vm-host"})
	if err != nil {
		t.Fatal(err)
	}
	dial := func(addr, export string) *nbdclient.Conn {
		t.Helper()
		c, err := nbdclient.Dial(ctx, addr, export, nbdclient.Options{Dial: n.Dial, Timeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Close)
		return c
	}

	// The VM: four writers, each write acknowledged before its next.
	log := consistency.NewLog()
	maxSeq := int64(3*diskSize/consistency.BlockSize) - 1
	var stop atomic.Bool
	var writeErr atomic.Value
	var wg sync.WaitGroup
	for range 4 {
		var conns [3]*nbdclient.Conn
		for d := range conns {
			conns[d] = dial(ipA+":10809", fmt.Sprintf("vm/d%d/%s", d, att.Token))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			block := make([]byte, consistency.BlockSize)
			for !stop.Load() {
				seq := log.Next()
				if seq > maxSeq {
					return
				}
				d, off := consistency.Place(seq, 3)
				consistency.Stamp(block, seq)
				if err := conns[d].WriteAt(block, off, false); err != nil {
					writeErr.Store(err)
					return
				}
				log.Ack(seq)
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	defer func() { stop.Store(true); wg.Wait() }()

	if _, err := a.API.SetDRPolicy(ctx, "vm", api.DRPolicy{Site: "b", Relationship: "db", RPO: rpo.String()}); err != nil {
		t.Fatal(err)
	}
	ro, err := b.API.Attach(ctx, "vm-dr", api.AttachmentSpec{Node: "checker", Mode: "ro"})
	if err != nil {
		t.Fatal(err)
	}
	// check reads point p of B's target and checks it is a cut.
	check := func(p string) int {
		t.Helper()
		present := map[int64]bool{}
		buf := make([]byte, 1<<20)
		for d := range 3 {
			c := dial(ipB+":10809", fmt.Sprintf("vm-dr@%s/d%d/%s", p, d, ro.Token))
			img := make([]byte, 0, diskSize)
			for off := int64(0); off < c.Size(); off += int64(len(buf)) {
				if err := c.ReadAt(buf, off); err != nil {
					t.Fatalf("read point %s disk d%d at %d: %v", p, d, off, err)
				}
				img = append(img, buf...)
			}
			c.Close()
			if err := consistency.Scan(img, d, 3, present); err != nil {
				t.Fatalf("point %s: %v", p, err)
			}
		}
		nw, err := log.Check(present)
		if err != nil {
			t.Fatalf("point %s is not a consistent cut of the VM's writes: %v", p, err)
		}
		return nw
	}

	var maxLag time.Duration
	var last string
	checked := 0
	end := time.Now().Add(length)
	for time.Now().Before(end) {
		time.Sleep(time.Second)
		if err, _ := writeErr.Load().(error); err != nil {
			t.Fatalf("the VM's write failed: %v", err)
		}
		sts, err := a.API.DRStatus(ctx)
		if err != nil || len(sts) != 1 {
			t.Fatalf("dr status: %v %+v", err, sts)
		}
		st := sts[0]
		maxLag = max(maxLag, st.Lag)
		if st.Missed || st.Lag > rpo {
			t.Fatalf("the lag passed the RPO of %v: %+v", rpo, st)
		}
		targets, err := b.API.DRTargets(ctx)
		if err != nil || len(targets) != 1 {
			t.Fatalf("site B's targets: %v %+v", err, targets)
		}
		ps := targets[0].Points
		if len(ps) == 0 || ps[len(ps)-1].Snapshot == last {
			continue
		}
		last = ps[len(ps)-1].Snapshot
		nw := check(last)
		checked++
		t.Logf("point %s: %d writes, a consistent cut; lag now %v (at most %v so far), %d writes acknowledged",
			last, nw, st.Lag.Round(time.Millisecond), maxLag.Round(time.Millisecond), log.Acked())
	}
	// Points keep coming: at least one per RPO (one each half RPO is the
	// schedule; the lag check above is the bound).
	if want := int(length / rpo); checked < want {
		t.Fatalf("%d points checked in %v, want at least %d (one each RPO)", checked, length, want)
	}
	t.Logf("%v of writes and DR at an RPO of %v: %d points, each a consistent cut; the lag peaked at %v",
		length, rpo, checked, maxLag.Round(time.Millisecond))
}
