#!/usr/bin/env bash
# rootfs.sh OUT: the Debian root filesystem of the quiver image, as a tarball
# made by mmdebstrap (no daemon, no container engine), linked or copied to
# OUT.
#
# SOURCE_DATE_EPOCH is the time of the last commit of this file: the same
# script gives the same file times, whatever quiver commit builds it. The
# tarball is cached by that time and the whole mmdebstrap command line
# (suite, mirror, architecture, variant, package list, hooks) under
# ${QUIVER_IMAGE_CACHE:-~/.cache/quiver-e2e/image}, so a second `make image`
# does not download Debian again. What stays unreproducible: the mirror moves (point
# MIRROR at a snapshot.debian.org URL to pin it). docs/image.md.
set -euo pipefail
out=${1:?usage: rootfs.sh OUT}
here=$(cd "$(dirname "$0")" && pwd)

SUITE=${SUITE:-bookworm}
ARCH=${ARCH:-$(dpkg --print-architecture)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
cache=${QUIVER_IMAGE_CACHE:-${HOME}/.cache/quiver-e2e/image}

# What each package is for; quiver itself is a static binary and needs no
# library. Everything a quiver command execs in a pod is here:
#   libnbd-bin       nbdfuse: Block mode serves the NBD export as a file on a
#                    FUSE mount (CSI node plugin, device agent, endpoint)
#   fuse3            fusermount3, which unmounts nbdfuse's mount; libfuse3
#   mount            mount and umount (k8s.io/mount-utils: the CSI node
#                    plugin's bind mounts) and losetup (the loop device over
#                    nbdfuse's file)
#   ca-certificates  the system roots, for a quiver CLI or webhook talking to
#                    a server whose certificate a public CA signed
# util-linux (blkid, blockdev, ...) is Essential, so in every variant.
# Left out on purpose: e2fsprogs and xfsprogs (quiver formats nothing:
# Filesystem mode binds a volume's directory, Block mode hands the raw device
# to the VM; the pool's filesystem is the host's), qemu-utils (qemu-img runs
# only in `quiver transfer`, an operator's command, not in a pod), systemd
# (mount-utils mounts without systemd-run when it is missing).
PACKAGES=libnbd-bin,fuse3,mount,ca-certificates

args=(
	--variant=essential
	--architectures="$ARCH"
	--include="$PACKAGES"
	# /usr merged by symlinks with usr-is-merged, not by the usrmerge
	# package, which would bring perl (40 MB) into the image.
	--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
	# No manuals, documentation or translations, but the copyright files.
	--dpkgopt='path-exclude=/usr/share/man/*'
	--dpkgopt='path-exclude=/usr/share/info/*'
	--dpkgopt='path-exclude=/usr/share/locale/*'
	--dpkgopt='path-exclude=/usr/share/doc/*'
	--dpkgopt='path-include=/usr/share/doc/*/copyright'
	# The host's names and resolver: the runtime mounts its own.
	--customize-hook='rm -f "$1/etc/resolv.conf" "$1/etc/hostname"'
	# Logs and the backup copies of dpkg's and debconf's databases.
	--customize-hook='rm -rf "$1"/var/log/* "$1"/var/cache/debconf/*-old "$1"/var/lib/dpkg/*-old'
	"$SUITE" - "$MIRROR"
)

SOURCE_DATE_EPOCH=$(git -C "$here" log -1 --format=%ct -- rootfs.sh 2>/dev/null || true)
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-0}
key=$(printf '%s\n' "$SOURCE_DATE_EPOCH" "$SUITE" "$ARCH" "${args[@]}" | sha256sum | cut -c1-16)
cached="$cache/rootfs-$SUITE-$ARCH-$key.tar"
if [ ! -s "$cached" ]; then
	mkdir -p "$cache"
	echo "rootfs: mmdebstrap $SUITE ($ARCH, $PACKAGES) into $cached" >&2
	start=$(date +%s)
	# A temporary file of its own: two builds at once (a test and make
	# image) each write theirs, and the rename is atomic.
	tmp=$(mktemp "$cached.XXXXXX")
	if ! mmdebstrap --quiet "${args[@]}" >"$tmp" 2>"$tmp.log"; then
		tail -n 40 "$tmp.log" >&2
		echo "rootfs: mmdebstrap failed; its log: $tmp.log" >&2
		rm -f "$tmp"
		exit 1
	fi
	chmod 0644 "$tmp"
	mv "$tmp" "$cached"
	rm -f "$tmp.log"
	echo "rootfs: built in $(($(date +%s) - start)) s" >&2
fi
ln -f "$cached" "$out" 2>/dev/null || cp "$cached" "$out"
