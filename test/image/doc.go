// Package image tests `make image` and the program that assembles images
// (build/image): the assembly from the same inputs gives the same image
// byte for byte, and the quiver image, loaded into podman, runs `quiver
// version` and `nbdfuse --version` with a version label equal to its tag.
//
// The reproducibility test needs only go. The podman test needs root,
// mmdebstrap, podman and runc, and the Debian mirror on a cold cache
// (build/image/rootfs.sh); without them it skips, and fails under CI.
package image
