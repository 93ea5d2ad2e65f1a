// Package storm is the provisioning-storm benchmark (make bench-storm):
// KubeVirt VMs provisioned through quiver's CSI controller, in process,
// against a real quiver server, in two models side by side:
//
//   - per VM (quiver): one CreateVolume per VM with all its disks
//     (parameters disks=disk=...,data=...,logs=...,swap=...), then one
//     CreateSnapshot per VM;
//   - per disk (today's CSI drivers): one one-disk CreateVolume per disk,
//     then one CreateSnapshot per disk volume.
//
// Each model gets a fresh server and pool; calls go over the CSI gRPC
// socket from WORKERS concurrent workers, as external-provisioner and
// external-snapshotter issue them. It prints wall times, rates and the
// Kubernetes objects each model needs (PVC + PV per volume, VolumeSnapshot
// + VolumeSnapshotContent per snapshot), with ratios. It measures and never
// asserts; it runs only when QUIVER_BENCH=1. QUIVER_STORM_VMS (default
// 1000), QUIVER_STORM_DISKS (4), QUIVER_STORM_WORKERS (10),
// QUIVER_STORM_BUDGET (seconds per phase, 600) and QUIVER_BENCH_DIR (the
// pool's parent directory, default a temporary one) tune it. Snapshots are
// measured twice: through the CSI controller, and through the quiver API
// alone (a second snapshot of every volume). QUIVER_STORM_PHASES=create
// measures the creates only, and QUIVER_STORM_ROUNDS=N (default 1) repeats
// the whole measurement N times on fresh servers, printing each round's
// load average and, at the end, the CreateVolume ratio of every round and
// their median: on a shared machine one round's ratio moves with the load.
package storm
