#!/usr/bin/env bash
# NBD data-path benchmark: quiver side by side with nbdkit (file plugin),
# qemu-nbd (cache=none, aio=native) and fio on the raw file, all on the same
# file, all driven by the same client (fio's nbd engine, libnbd), in one run.
# Prints a markdown table with ratios. Measures; asserts nothing.
#
#   make bench-nbd                       # or: test/bench/nbd.sh [RUNTIME_SECONDS] [DIR]
set -euo pipefail
RUNTIME=${1:-${RUNTIME:-10}}
BASE=${2:-$(mktemp -d /tmp/quiver-bench-nbd.XXXXXX)}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
for t in fio nbdkit qemu-nbd nbdcopy python3; do
	command -v $t >/dev/null || { echo "missing $t: apt-get install fio nbdkit qemu-utils libnbd-bin" >&2; exit 1; }
done
SIZE=$((1 << 30))
PIDS=()
cleanup() { for p in "${PIDS[@]:-}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$BASE"; }
trap cleanup EXIT

go build -o "$BASE/quiver" "$ROOT/cmd/quiver"
Q="$BASE/quiver"
API=127.0.0.1:17481
QPORT=20811
"$Q" server --pool "$BASE/pool" --listen $API --nbd-listen 127.0.0.1:$QPORT --nbd-socket "$BASE/quiver.sock" --log-level warn &
PIDS+=($!)
for _ in $(seq 100); do curl -sf http://$API/v1/pool >/dev/null 2>&1 && break; sleep 0.05; done
QUIVER_SERVER=http://$API "$Q" volume create bench --capacity 1Gi --disk disk=1Gi >/dev/null
IMG="$BASE/pool/volumes/bench/disks/disk.img"
# Fill the disk with data through quiver so that reads hit data, not holes.
head -c $SIZE /dev/urandom > "$BASE/random.bin"
nbdcopy "$BASE/random.bin" "nbd://127.0.0.1:$QPORT/bench/disk"
rm -f "$BASE/random.bin"
sync

# fio_run NAME URI|FILE RW BS QD -> prints IOPS (4k) or MB/s (1m)
fio_run() {
	local target=$1 rw=$2 bs=$3 qd=$4 args
	if [[ $target == nbd* ]]; then
		args=(--ioengine=nbd --uri="$target")
	else
		args=(--ioengine=io_uring --filename="$target")
	fi
	fio --name=b "${args[@]}" --rw="$rw" --bs="$bs" --iodepth="$qd" --size=$SIZE --runtime="$RUNTIME" \
		--time_based --ramp_time=1 --norandommap --randrepeat=0 --output-format=json 2>/dev/null |
		python3 -c '
import json,sys
s=sys.stdin.read()
j=json.loads(s[s.index("{"):])["jobs"][0]
bs=sys.argv[1]
io=j["read"] if j["read"]["io_bytes"]>0 else j["write"]
print(round(io["iops"]) if bs=="4k" else round(io["bw_bytes"]/1e6))' "$bs"
}

CASES=("randread 4k 1" "randread 4k 32" "randwrite 4k 1" "randwrite 4k 32" "read 1m 8" "write 1m 8")
declare -A R
start_peer() { # kind transport -> sets URI, PEER
	local kind=$1 tr=$2
	# Every target starts with the file in the page cache: qemu-nbd's
	# O_DIRECT writes evict it, which would penalise whoever runs next.
	cat "$IMG" >/dev/null
	case $kind/$tr in
	nbdkit/unix) nbdkit --exit-with-parent -f -U "$BASE/nbdkit.sock" file "$IMG" & PEER=$!; URI="nbd+unix:///?socket=$BASE/nbdkit.sock";;
	nbdkit/tcp) nbdkit --exit-with-parent -f -i 127.0.0.1 -p 20812 file "$IMG" & PEER=$!; URI="nbd://127.0.0.1:20812/";;
	qemu-nbd/unix) qemu-nbd -f raw --cache=none --aio=native -t -e 8 -k "$BASE/qemu.sock" "$IMG" & PEER=$!; URI="nbd+unix:///?socket=$BASE/qemu.sock";;
	qemu-nbd/tcp) qemu-nbd -f raw --cache=none --aio=native -t -e 8 -b 127.0.0.1 -p 20813 "$IMG" & PEER=$!; URI="nbd://127.0.0.1:20813/";;
	quiver/unix) PEER=""; URI="nbd+unix:///bench/disk?socket=$BASE/quiver.sock";;
	quiver/tcp) PEER=""; URI="nbd://127.0.0.1:$QPORT/bench/disk";;
	esac
	sleep 0.5
}
for tr in unix tcp; do
	for kind in quiver nbdkit qemu-nbd; do
		start_peer $kind $tr
		for c in "${CASES[@]}"; do
			set -- $c
			R[$kind/$tr/$1/$2/$3]=$(fio_run "$URI" "$1" "$2" "$3")
		done
		[ -n "$PEER" ] && { kill "$PEER"; wait "$PEER" 2>/dev/null || true; }
	done
done
for c in "${CASES[@]}"; do
	set -- $c
	R[raw/$1/$2/$3]=$(fio_run "$IMG" "$1" "$2" "$3")
done

ratio() { python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f'{a/b:.2f}x' if b else '-')" "$1" "$2"; }
echo
echo "fio $(fio --version), nbdkit $(nbdkit --version | cut -d' ' -f2), $(qemu-nbd --version | head -1), $(nproc) cores, ${RUNTIME}s per case"
echo
echo "| case | transport | quiver | nbdkit | qemu-nbd | raw file (io_uring) | quiver/nbdkit | quiver/qemu-nbd |"
echo "|---|---|---|---|---|---|---|---|"
for tr in unix tcp; do
	for c in "${CASES[@]}"; do
		set -- $c
		unit=IOPS; [ "$2" = 1m ] && unit=MB/s
		q=${R[quiver/$tr/$1/$2/$3]} k=${R[nbdkit/$tr/$1/$2/$3]} n=${R[qemu-nbd/$tr/$1/$2/$3]}
		echo "| $1 $2 QD$3 ($unit) | $tr | $q | $k | $n | ${R[raw/$1/$2/$3]} | $(ratio $q $k) | $(ratio $q $n) |"
	done
done
