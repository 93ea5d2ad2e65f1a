package historytest

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"time"

	"github.com/quiverstorage/quiver/internal/api"
	"github.com/quiverstorage/quiver/internal/testfs"
)

// cycle is one fault under the writers, with what it saw.
type cycle struct {
	i     int
	fault string
	c     *cluster
	w     *writer
	rng   *rand.Rand
	vol   string
	start api.Volume // the record when the cycle began
	prim  *node      // the primary then
	cp    *node      // the other copy then
	fwd   *node      // the node without a copy
	what  []string   // what the fault did, for the report
	fails []string   // what the checks found

	// A partition of the primary: when, whether etcd's ports only.
	cut      time.Time
	etcdOnly bool
}

func (cy *cycle) note(format string, args ...any) {
	cy.what = append(cy.what, fmt.Sprintf(format, args...))
}

func (cy *cycle) failf(format string, args ...any) {
	cy.fails = append(cy.fails, fmt.Sprintf(format, args...))
}

// faults are the faults a cycle draws from, by name
// (QUIVER_HISTORY_FAULTS picks some).
var faults = []struct {
	name string
	run  func(cy *cycle)
}{
	{"kill-primary", killPrimary},
	{"kill-copy", killCopy},
	{"kill-etcd-leader", killEtcdLeader},
	{"partition-primary", partitionPrimary},
	{"power-cut-copy", powerCutCopy},
	{"io-error-in-resync", ioErrorInResync},
	{"drop-copy-connection", dropCopyConnection},
	{"freeze-copy", freezeCopy},
}

// writesGoOn waits for the writers to have n more FLUSHes acknowledged:
// the clients make progress after the fault.
func (cy *cycle) writesGoOn(n int64, after string) {
	start := time.Now()
	if err := cy.w.waitFlushes(n, 90*time.Second); err != nil {
		cy.failf("the writers stalled %s: %v", after, err)
		return
	}
	cy.note("writers went on %s (%d FLUSHes in %v)", after, n, time.Since(start).Round(time.Millisecond))
}

// waitPromotion waits for the other copy to be promoted after the primary
// went away.
func (cy *cycle) waitPromotion() (api.Volume, bool) {
	v, ok := cy.c.waitVolume(cy.vol, 40*time.Second, func(v api.Volume) bool {
		return v.Primary != cy.prim.name && v.Term > cy.start.Term
	})
	if !ok {
		cy.failf("no promotion within 40 s after the primary %s went: %s", cy.prim.name, formatCopies(v))
		return v, false
	}
	cy.note("%s promoted at term %d", v.Primary, v.Term)
	return v, true
}

func killPrimary(cy *cycle) {
	cy.c.kill(cy.prim)
	cy.note("SIGKILL of the primary %s", cy.prim.name)
	cy.waitPromotion()
	cy.writesGoOn(8, "after the failover")
	cy.c.restart(cy.prim)
}

func killCopy(cy *cycle) {
	cy.c.kill(cy.cp)
	cy.note("SIGKILL of the copy %s", cy.cp.name)
	cy.writesGoOn(8, "with the copy down")
	cy.c.restart(cy.cp)
}

func killEtcdLeader(cy *cycle) {
	leader := cy.c.etcdLeader()
	role := "holds no copy"
	switch leader {
	case cy.prim:
		role = "the primary"
	case cy.cp:
		role = "the copy"
	}
	cy.c.kill(leader)
	cy.note("SIGKILL of the etcd leader %s (%s)", leader.name, role)
	if leader == cy.prim {
		cy.waitPromotion()
	}
	cy.writesGoOn(8, "with the etcd leader down")
	cy.c.restart(leader)
}

// partitionPrimary cuts the primary off from the other nodes (from
// everything but NBD when etcdOnly, so that it can still write its copy,
// whose term fencing must refuse it once the copy is promoted), while the
// test's clients in the hub still reach it.
func partitionPrimary(cy *cycle) {
	cy.etcdOnly = cy.rng.IntN(2) == 1
	var rs [][]string
	for _, o := range cy.c.nodes {
		if o == cy.prim {
			continue
		}
		if cy.etcdOnly {
			for _, dir := range []string{"--dport", "--sport"} {
				rs = append(rs, []string{"OUTPUT", "-d", o.ip, "-p", "tcp", dir, "10809", "-j", "ACCEPT"},
					[]string{"INPUT", "-s", o.ip, "-p", "tcp", dir, "10809", "-j", "ACCEPT"})
			}
		}
		rs = append(rs, []string{"OUTPUT", "-d", o.ip, "-j", "DROP"}, []string{"INPUT", "-s", o.ip, "-j", "DROP"})
	}
	heal := rules(cy.c.t, cy.prim.ns, rs)
	cy.cut = time.Now()
	cy.note("partition of the primary %s from the other nodes (%s) at %s", cy.prim.name,
		map[bool]string{true: "etcd only: NBD to its copy kept", false: "everything"}[cy.etcdOnly], stamp(cy.cut))
	if v, ok := cy.waitPromotion(); ok {
		cy.checkLease(v)
	}
	cy.writesGoOn(8, "after the failover")
	heal()
	cy.note("healed at %s", stamp(time.Now()))
}

// checkLease: the cut-off primary acknowledges no request sent after its
// lease can have expired (the cut + one TTL + the time an etcd leader cut
// off with it may still renew leases), nor after the promotion. Disk 1's
// handle was connected to the primary itself, so what it acknowledged on
// that connection is the old primary's.
func (cy *cycle) checkLease(v api.Volume) {
	promoted, ok := promotedAt(cy.c.byName(v.Primary), cy.vol, v.Term)
	if !ok {
		cy.failf("no promotion at term %d in %s's log", v.Term, v.Primary)
		return
	}
	acks, addr, ok := cy.w.lastAcksOn(1, cy.cut)
	if !ok || !strings.HasPrefix(addr, cy.prim.ip+":") {
		cy.note("lease check skipped: disk 1 was connected to %q at the cut, not to the primary (%s)", addr, cy.w.connects(1))
		return
	}
	var last time.Time
	for _, a := range acks {
		if a.sent.After(last) {
			last = a.sent
		}
		if !a.sent.Before(promoted) {
			cy.failf("disk 1: the cut-off primary %s acknowledged a request sent at %s (answered %s), after %s was promoted at %s; connections: %s",
				cy.prim.name, stamp(a.sent), stamp(a.at), v.Primary, stamp(promoted), cy.w.connects(1))
		}
		if limit := cy.cut.Add(leaseTTL + leaderGrace); a.sent.After(limit) {
			cy.failf("disk 1: the cut-off primary %s acknowledged a request sent %v after the cut (answered %s), past its lease (%v + %v); connections: %s",
				cy.prim.name, a.sent.Sub(cy.cut).Round(time.Millisecond), stamp(a.at), leaseTTL, leaderGrace, cy.w.connects(1))
		}
	}
	if !last.IsZero() {
		cy.note("the cut-off primary's last acknowledged request was sent %v after the cut, %v before the promotion",
			last.Sub(cy.cut).Round(time.Millisecond), promoted.Sub(last).Round(time.Millisecond))
	}
}

// leaderGrace is how long after a cut an etcd leader on the cut-off side may
// still renew leases (about two election timeouts; docs/cluster.md).
const leaderGrace = 2 * time.Second

// powerCut shuts nd's pool filesystem down without flushing its log (what
// the page cache and the log held is lost, as in a power cut), waits for
// the primary to drop the copy from the in-sync set, kills the server,
// mounts the filesystem again (log recovery) and restarts the node. With
// quiet, the writers pause once the copy is dropped: the copy's resync then
// copies only what the primary recorded for it when it dropped it (the
// failed request and every change since the last FLUSH began), not the
// whole disk that further writes would soon cover.
func (cy *cycle) powerCut(nd *node, why string, quiet bool) {
	cy.powerCutThen(nd, why, func() {
		if quiet {
			cy.w.pause()
			cy.note("writers paused")
		}
	})
}

// powerCutThen is powerCut, calling dropped once the copy left the in-sync
// set.
func (cy *cycle) powerCutThen(nd *node, why string, dropped func()) {
	if err := testfs.ShutdownXFS(nd.mnt); err != nil {
		cy.c.t.Fatalf("%s: %v", nd.name, err)
	}
	at := time.Now()
	cy.note("power cut of %s's pool (XFS shut down without a log flush) %s at %s", nd.name, why, stamp(at))
	if v, ok := cy.c.waitVolume(cy.vol, 20*time.Second, func(v api.Volume) bool {
		return copyState(v, nd.name) != api.CopyInSync
	}); ok {
		cy.note("%s's copy left the in-sync set %v later: %s", nd.name, time.Since(at).Round(time.Millisecond), formatCopies(v))
		dropped()
	} else {
		cy.note("%s's copy still in sync 20 s after the power cut: %s", nd.name, formatCopies(v))
	}
	cy.c.kill(nd)
	if err := testfs.Remount(nd.mnt); err != nil {
		cy.c.t.Fatalf("%s: %v", nd.name, err)
	}
	cy.c.restart(nd)
}

// powerCutCopy cuts the copy's power under writes; half of the time the
// writers then pause until the check (quiet, see powerCut).
func powerCutCopy(cy *cycle) {
	quiet := cy.rng.IntN(2) == 0
	cy.powerCut(cy.cp, "under writes", quiet)
	if !quiet {
		cy.writesGoOn(8, "after the power cut")
	}
}

// ioErrorInResync makes the copy fall behind on the first half of each
// disk (killed while the writers write there only), starts it again and,
// while its resync copies that half and the writers write the other one
// (changes mirrored to the copy as they come), cuts the power of its pool:
// the resync's writes fail with EIO and the mirrored writes not yet FLUSHed
// are lost on the copy. The writers then go back to the first half, so that
// only what the primary recorded when the resync stopped brings the second
// half back.
func ioErrorInResync(cy *cycle) {
	cy.w.zone.Store(zoneLow)
	cy.c.kill(cy.cp)
	cy.note("SIGKILL of the copy %s with the writers on the first half of each disk", cy.cp.name)
	cy.writesGoOn(24, "with the copy down")
	cy.c.spawn(cy.cp)
	deadline := time.Now().Add(60 * time.Second)
	var resyncing time.Time // when the resync was first seen running
	for {
		st := api.Copy{}
		v, err := getVolume(cy.prim, cy.vol)
		for _, x := range v.Copies {
			if x.Node == cy.cp.name {
				st = x
			}
		}
		if err == nil && st.State == api.CopyResyncing && resyncing.IsZero() {
			resyncing = time.Now()
			cy.w.zone.Store(zoneHigh)
		}
		// Into the resync: some bytes copied (its progress is recorded
		// every second), or a quarter of a second after it began.
		if err == nil && st.State == api.CopyResyncing && (st.DoneBytes > 0 || time.Since(resyncing) > 250*time.Millisecond) {
			cy.note("the writers wrote the second half for %v of the resync", time.Since(resyncing).Round(time.Millisecond))
			cy.powerCutThen(cy.cp, fmt.Sprintf("during its resync (%d of %d bytes copied)", st.DoneBytes, st.TotalBytes),
				func() { cy.w.zone.Store(zoneLow) })
			break
		}
		if err == nil && st.State == api.CopyInSync || time.Now().After(deadline) {
			cy.note("the resync was not seen running (copy %s: %+v, %v): the copy's pool lost power in sync instead", cy.cp.name, st, err)
			cy.c.waitReady(cy.cp)
			cy.powerCut(cy.cp, "after its resync", false)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cy.writesGoOn(8, "after the power cut")
}

// dropCopyConnection resets the primary's NBD connections to its copy for
// a second, with the writers' requests queued on them (iptables in the
// primary's namespace answers each of its packets to the copy's NBD port
// with a TCP reset).
func dropCopyConnection(cy *cycle) {
	heal := rules(cy.c.t, cy.prim.ns, [][]string{{"OUTPUT", "-d", cy.cp.ip, "-p", "tcp", "--dport", "10809",
		"-j", "REJECT", "--reject-with", "tcp-reset"}})
	at := time.Now()
	cy.note("the primary %s's connections to the copy %s reset at %s", cy.prim.name, cy.cp.name, stamp(at))
	time.Sleep(time.Second)
	heal()
	if v, ok := cy.c.waitVolume(cy.vol, 10*time.Second, func(v api.Volume) bool {
		return copyState(v, cy.cp.name) != api.CopyInSync
	}); ok {
		cy.note("the copy left the in-sync set: %s", formatCopies(v))
	} else {
		cy.note("the copy stayed in sync: %s", formatCopies(v))
	}
	cy.writesGoOn(8, "after the reset")
}

func stamp(t time.Time) string { return t.UTC().Format("15:04:05.000") }

// freezeCopy stops the copy's process (SIGSTOP) for longer than the
// primary waits for a silent copy, with the primary's requests queued on
// its connections, and lets it go on (SIGCONT): it then reads and runs
// requests of a connection the primary gave up on, while the primary
// resyncs it on a new one.
func freezeCopy(cy *cycle) {
	if err := cy.cp.proc.Signal(syscall.SIGSTOP); err != nil {
		cy.c.t.Fatal(err)
	}
	cy.cp.ready = false // its API does not answer: ask the others
	at := time.Now()
	cy.note("SIGSTOP of the copy %s at %s", cy.cp.name, stamp(at))
	cy.writesGoOn(8, "with the copy frozen")
	if v, ok := cy.c.waitVolume(cy.vol, 20*time.Second, func(v api.Volume) bool {
		return copyState(v, cy.cp.name) != api.CopyInSync
	}); ok {
		cy.note("the copy left the in-sync set %v after the SIGSTOP: %s", time.Since(at).Round(time.Millisecond), formatCopies(v))
	} else {
		cy.note("the copy stayed in sync: %s", formatCopies(v))
	}
	if err := cy.cp.proc.Signal(syscall.SIGCONT); err != nil {
		cy.c.t.Fatal(err)
	}
	cy.cp.ready = true
	cy.note("SIGCONT at %s", stamp(time.Now()))
	cy.writesGoOn(8, "after the SIGCONT")
}
