// Package clustertest holds the acceptance tests of quiver as a cluster
// (docs/cluster.md). Every storage node is its own `quiver server` process
// in its own network namespace, joined to the others by a veth pair to a
// bridge in a hub namespace of the test's own; each runs an embedded etcd
// member, over TLS with client certificates that `quiver cluster certs`
// makes (QUIVER_ETCD_PLAINTEXT=1: plaintext with --etcd-insecure). The test talks to the nodes from the hub namespace (its API
// connections are made there) and runs the CLI there too.
//
//   - TestCluster: three nodes in two failure domains: node list (API and
//     CLI), a replicas=2 volume on two distinct nodes in two domains with
//     both copies in sync and in those nodes' pools only, replicas above the
//     nodes up refused with nothing recorded, a killed node shown down and
//     back up after a restart, and delete removing every copy;
//   - TestJoinRefused: a fourth node that is refused at start, exiting
//     non-zero with a message naming the conflict, while the cluster keeps
//     its three members: etcd unreachable, a taken node name, a node of
//     another cluster, a wrong cluster token, plaintext etcd beyond
//     loopback.
//   - TestFailoverKill, TestFailoverPartition, TestFailoverQEMUClient: failover
//     (issue 15, acceptance 1 and 2, and QEMU's NBD client through a
//     failover): SIGKILL of the primary, the other copy or the etcd leader,
//     and a primary cut off with iptables, under clients whose every
//     acknowledged write must be on the primary afterwards (and, through
//     the kills, fio verifying with crc32c); after the
//     QEMU client's failover the old primary comes back and is resynced
//     (whole) by the new primary until both copies are byte-identical.
//   - TestFailoverGuest: the test/migration guest under QEMU (TCG) writing
//     through a SIGKILL of the primary (acceptance 4), one disk through the
//     node without a copy (forwarded), the other through a host name of all
//     nodes with the primary first (QEMU reconnects, reconnect-delay); no
//     failed request, no I/O error in the guest, every record QEMU completed
//     intact on the new primary (test/migration/record).
//   - TestResync, TestReplicatedSnapshot, TestCopyDiskFull, TestRebuild:
//     incremental resync of a copy that was down (acceptance 3), snapshots
//     at one cut on every copy (acceptance 6), a copy on a full filesystem
//     (acceptance 7) and the rebuild of a gone node's copy on another node.
//   - TestAnyNodeServes, TestAnyNodeCSI, TestClusterTenantSnapshots: any
//     node's API carries a snapshot, clone, rollback or disk change to the
//     volume's primary (client, CLI and the CSI controller pointed at a node
//     that is not the primary), and a tenant's snapshots, clones and
//     rollbacks on the cluster with its quotas counted cluster-wide and
//     another tenant refused (docs/cluster.md, "Any node's API").
//   - TestRefusalTiming, TestForwardedPartition: issue 29, acceptance 4
//     and 5: a wrong token and an unknown volume get the same refusal in
//     the same time on every node (medians logged, docs/cluster.md), and a
//     client forwarded by the node without a copy is acknowledged again on
//     every disk within L + 3 s of a cut of the primary (its link down).
//   - TestNodesInAndOut: three nodes grow to five with quiver node add and
//     shrink back to three with quiver node remove --drain, with writers on
//     two replicated volumes throughout (issue 32, acceptance 2); a removed
//     node stops and is refused when it starts again.
//   - TestBenchCluster: the cluster benchmark (acceptance 8, make
//     bench-cluster); it runs only with QUIVER_BENCH=1.
//
// They need root, ip and ss (iproute2), iptables, qemu-io, fio and mkfs.ext4;
// TestFailoverGuest also qemu-system-x86_64, busybox-static, apt-get and
// dpkg (internal/testguest). They skip without them, and fail instead when
// CI is set. QUIVER_NETNS_PREFIX starts the names of their namespaces;
// QUIVER_FAILOVER_KILL_CYCLES, QUIVER_FAILOVER_PARTITION_CYCLES and
// QUIVER_GUEST_FAILOVERS raise the cycle counts for soak runs;
// QUIVER_RESYNC_DOWN sets how long TestResync's copy is down, and
// QUIVER_GUEST_RECONNECT_DELAY the guest's QEMU reconnect-delay.
//
// Imports from quiver: api, client, consistency, csi, forward, replica,
// testfs, testguest, testserver, tlscert, test/migration/record.
package clustertest
