// Package nodeplugin tests that Block-mode devices outlive the CSI node
// plugin: the real binary runs `quiver device-agent` and `quiver csi --mode
// node` as separate processes, the plugin in a PID namespace of its own as
// in a container, and a QEMU guest (TCG) writes through the published block
// device while the plugin is killed with everything in its namespace and
// started again.
//
// Needs root, nbdfuse (libnbd-bin), losetup, /dev/fuse, qemu-system-x86_64
// and busybox-static; without them it skips, and fails under CI.
package nodeplugin
