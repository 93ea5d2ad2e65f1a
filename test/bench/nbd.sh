#!/usr/bin/env bash
# NBD data-path benchmark: quiver side by side with nbdkit (file plugin),
# qemu-nbd (cache=none, aio=native) and fio on the raw file, all on the same
# file, all driven by the same client (fio's nbd engine, libnbd), in one run.
# Prints a markdown table with ratios. Measures; asserts nothing.
#
#   make bench-nbd                       # or: test/bench/nbd.sh [RUNTIME_SECONDS] [DIR]
#
# DIR must not exist (it is made and removed); put it on the filesystem to
# measure. ROUNDS (default 3) runs per case and server, alternating between
# servers; the table shows the median and every run. KINDS and TRANSPORTS
# pick a subset while working on one case:
#   KINDS="quiver nbdkit" TRANSPORTS=unix test/bench/nbd.sh 5
set -euo pipefail
RUNTIME=${1:-${RUNTIME:-10}}
ROUNDS=${ROUNDS:-3}
BASE=${2:-$(mktemp -u /tmp/quiver-bench-nbd.XXXXXX)}
KINDS=${KINDS:-quiver nbdkit qemu-nbd}
TRANSPORTS=${TRANSPORTS:-unix tcp}
mkdir "$BASE"
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
declare -A R URI
# start_peers TRANSPORT: starts nbdkit and qemu-nbd on that transport and
# sets URI[kind] for every kind. All kinds serve the same file at once, so
# that the runs of a case can alternate between them: the machine's speed
# drifts over minutes, and alternating spreads the drift over every kind.
start_peers() {
	local tr=$1
	PEERS=()
	if [ "$tr" = unix ]; then
		URI[quiver]="nbd+unix:///bench/disk?socket=$BASE/quiver.sock"
		URI[nbdkit]="nbd+unix:///?socket=$BASE/nbdkit.sock"
		URI[qemu-nbd]="nbd+unix:///?socket=$BASE/qemu.sock"
		[[ " $KINDS " == *" nbdkit "* ]] && { nbdkit --exit-with-parent -f -U "$BASE/nbdkit.sock" file "$IMG" & PEERS+=($!); }
		[[ " $KINDS " == *" qemu-nbd "* ]] && { qemu-nbd -f raw --cache=none --aio=native -t -e 8 -k "$BASE/qemu.sock" "$IMG" & PEERS+=($!); }
	else
		URI[quiver]="nbd://127.0.0.1:$QPORT/bench/disk"
		URI[nbdkit]="nbd://127.0.0.1:20812/"
		URI[qemu-nbd]="nbd://127.0.0.1:20813/"
		[[ " $KINDS " == *" nbdkit "* ]] && { nbdkit --exit-with-parent -f -i 127.0.0.1 -p 20812 file "$IMG" & PEERS+=($!); }
		[[ " $KINDS " == *" qemu-nbd "* ]] && { qemu-nbd -f raw --cache=none --aio=native -t -e 8 -b 127.0.0.1 -p 20813 "$IMG" & PEERS+=($!); }
	fi
	sleep 1
}
stop_peers() { for p in "${PEERS[@]:-}"; do [ -n "$p" ] && { kill "$p"; wait "$p" 2>/dev/null || true; }; done; }
for tr in $TRANSPORTS; do
	start_peers $tr
	for c in "${CASES[@]}"; do
		set -- $c
		for round in $(seq "$ROUNDS"); do
			for kind in $KINDS; do
				# Every run starts with the file in the page cache:
				# qemu-nbd's O_DIRECT writes evict it, which would
				# penalise whoever runs next.
				cat "$IMG" >/dev/null
				R[$kind/$tr/$1/$2/$3]+=" $(fio_run "${URI[$kind]}" "$1" "$2" "$3")"
			done
		done
	done
	stop_peers
done
[ "${RAW:-1}" = 1 ] && for c in "${CASES[@]}"; do
	set -- $c
	for round in $(seq "$ROUNDS"); do
		cat "$IMG" >/dev/null
		R[raw/$1/$2/$3]+=" $(fio_run "$IMG" "$1" "$2" "$3")"
	done
done

median() { python3 -c "import sys,statistics; v=[float(x) for x in sys.argv[1:]]; print(round(statistics.median(v)) if v else 0)" $1; }
ratio() { python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f'{a/b:.2f}x' if b else '-')" "$1" "$2"; }
echo
echo "fio $(fio --version), nbdkit $(nbdkit --version | cut -d' ' -f2), $(qemu-nbd --version | head -1), $(nproc) cores, file on $(findmnt -n -o FSTYPE --target "$BASE"), ${RUNTIME}s per run, median of $ROUNDS runs alternating between servers"
echo
echo "| case | transport | quiver | nbdkit | qemu-nbd | raw file (io_uring) | quiver/nbdkit | quiver/qemu-nbd | quiver runs | nbdkit runs |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for tr in $TRANSPORTS; do
	for c in "${CASES[@]}"; do
		set -- $c
		unit=IOPS; [ "$2" = 1m ] && unit=MB/s
		q=$(median "${R[quiver/$tr/$1/$2/$3]:-}") k=$(median "${R[nbdkit/$tr/$1/$2/$3]:-}") n=$(median "${R[qemu-nbd/$tr/$1/$2/$3]:-}")
		raw=-; [ -n "${R[raw/$1/$2/$3]:-}" ] && raw=$(median "${R[raw/$1/$2/$3]}")
		echo "| $1 $2 QD$3 ($unit) | $tr | $q | $k | $n | $raw | $(ratio $q $k) | $(ratio $q $n) |${R[quiver/$tr/$1/$2/$3]:-} |${R[nbdkit/$tr/$1/$2/$3]:-} |"
	done
done
