// Package historytest is acceptance 2 of issue 29: a history checker over
// a fault schedule (TestHistory). Three `quiver server` processes with
// embedded etcd members, each in its own network namespace (as
// test/cluster runs them) and each with its pool on a loop-mounted XFS of
// its own, hold a replicas=2 volume of two disks. Writers (two per disk,
// each owning its blocks) write self-identifying blocks and FLUSHes through
// forward.Disk handles, one started on the node without a copy (which
// forwards to the primary of the moment) and one on the primary itself,
// and log every request as sent and as answered in an
// internal/history.Log. Each cycle draws a fault with a seeded generator:
// SIGKILL of the primary, of the copy or of the etcd leader; a partition of
// the primary (from everything, or from etcd only); a power cut of the
// copy's pool (XFS shut down without a log flush, then mounted again); a
// power cut of the copy's pool during its resync (its writes fail with
// EIO, and the mirrored writes it had not FLUSHed are lost); the primary's
// connections to its copy reset with requests queued; the copy's process
// stopped until the primary gives up on it, then let go on.
// After each cycle the writers pause, the cluster settles, and every
// in-sync copy's disks are read from its pool and checked block by block
// against the history, and against the primary's (SHA-256); after a
// partition the old primary's acknowledgements are checked against its
// lease.
//
// It needs root, ip (iproute2), iptables, mkfs.xfs, losetup and mount; it
// skips without them, and fails instead when CI is set.
// QUIVER_HISTORY_CYCLES (default 30), QUIVER_HISTORY_SEED,
// QUIVER_HISTORY_FAULTS and QUIVER_HISTORY_MAX_FAILED steer it (see
// TestHistory); QUIVER_NETNS_PREFIX (default qvh) starts its namespaces'
// names.
//
// Imports from quiver: api, client, forward, history, testfs, testserver.
package historytest
