#!/usr/bin/env bash
# NBD data-path benchmark: quiver side by side with nbdkit (file plugin),
# qemu-nbd (cache=none, aio=native) and fio on the raw file, all driven by the
# same client (fio's nbd engine, libnbd), in one run. For each run it records,
# besides IOPS and MB/s, the server process's CPU time and context switches
# per request (test/bench/nbdrun), which move far less with machine noise than
# throughput, fio's own CPU per request (on loopback the kernel splits the
# transfer's work between the two sides), and fio's latency percentiles. Prints markdown tables: medians
# and the range of the runs, with ratios. Measures; asserts nothing.
#
#   make bench-nbd [RUNTIME=s] [ROUNDS=n] [DIR=path] [BASE=git-rev]
#   test/bench/nbd.sh [RUNTIME_SECONDS] [DIR]      (the same, settings from the environment)
#
# RUNTIME (default 10) seconds per run. ROUNDS (default 3) runs per case and
# server; within a round the servers take turns, and the order rotates from
# round to round. DIR must not exist (it is made and removed); put it on the
# filesystem to measure (default: a new directory in /tmp).
#
# BASE=<git rev> (A/B mode): quiver is also built at that revision (from
# `git archive`, into DIR) and runs as one more server, "quiver@<rev>",
# in the same rounds as the others, so that a change is measured before and
# after side by side. Each quiver serves its own pool, holding its own copy
# of the same random content, on the same filesystem; nbdkit, qemu-nbd and
# the raw-file runs use the first quiver's image.
#
# ALT="name:flags" (A/B of a switch): one more quiver from the same build,
# "quiver+name", started with those extra server flags, e.g.
# ALT="polled:--nbd-polled" measures the blocking reader against a reader
# left in Go's network poller. Like BASE, it serves its own pool.
#
# TRANSPORTS (default "unix tcp") may add tls: NBD over TLS on TCP (x509,
# certificates made here with openssl), quiver with --nbd-tls on, nbdkit with
# --tls=require and qemu-nbd with tls-creds-x509, fio's nbd engine with an
# nbds:// URI; set beside tcp, the same cases run plain and over TLS in one
# run (make bench-nbd-tls).
#
# KINDS has endpoint and encrypted (below) by default: the compute node's endpoint (issue 30),
# `quiver endpoint` serving quiver's disk on its unix socket and forwarding
# every request to quiver over TCP loopback, as a VM's QEMU reaches a
# cluster's primary through it. It runs in the tcp transport only (not at
# all without it), in the rows of quiver's direct TCP runs, the path it is
# measured against (QEMU straight to the primary); its CPU is quiver's plus
# the endpoint's (nbdrun -hop), fio's reported apart. Both
# present the token of one attachment (made for it), so every quiver run
# then connects with that token. The report ends with the endpoint against
# quiver direct: latency at QD1 (mean, p99) and CPU per request, ratios
# endpoint/direct and a verdict against acceptance 6 (at most 1.15x at QD1,
# 1.10x CPU per request at QD32). Just that comparison:
#   KINDS="quiver endpoint" TRANSPORTS=tcp RAW=0 \
#     CASES="randread 4k 1,randwrite 4k 1,randread 4k 32,randwrite 4k 32" make bench-nbd ROUNDS=5
#
# EPBASE=<git rev> (A/B of the endpoint alone): the endpoint is also built at
# that revision and runs beside the current one as "endpoint@<rev>", on its
# own root and socket, forwarding to the same quiver with the same token, in
# the same rounds (needs endpoint in KINDS). The general tables show both;
# the endpoint's ratios are the current one's.
#
# KINDS may add proxy: nbdkit's nbd plugin as the hop instead of the
# endpoint (on a unix socket, forwarding to quiver over TCP with the same
# token), what one NBD-parsing hop in C costs on the machine: the reference
# for the endpoint's cost over direct.
#
# KINDS may add encrypted: encryption at rest (issue 35, acceptance 5).
# One more quiver from the same build, started with --key-file (a key file
# made here), serving a volume made with --encrypt (XTS-AES-256 per 4 KiB
# block) on its own pool, filled with the same random content, in the same
# rounds and transports as quiver. The report ends with encrypted against
# plain quiver: throughput, latency and server CPU per request, ratios
# encrypted/plain, MB of 1 MiB reads per second of server CPU, and a verdict
# against the goals (at most 1.10x CPU per request at 4k QD32, at least
# 1000 MB/cpu-s for 1 MiB reads). Just that comparison (make bench-nbd-encrypted):
#   KINDS="quiver encrypted" TRANSPORTS=unix RAW=0 SNAPWRITE=0 \
#     CASES="randread 4k 1,randread 4k 32,randwrite 4k 32,read 1m 8,write 1m 8" test/bench/nbd.sh
#
# KINDS may add null: nbdkit's null plugin, a server that does no I/O, the
# floor of an NBD round trip on the machine (for QD1 latency).
#
# KINDS, TRANSPORTS and CASES pick a subset while working on one case:
#   KINDS="quiver nbdkit" TRANSPORTS=unix CASES="read 1m 8" RAW=0 test/bench/nbd.sh 5
# PORT (default 20811): quiver's NBD port; the others use the next ones,
# and the API ports are PORT+10 and PORT+11.
#
# SNAPWRITE (default 1; root, mkfs.xfs): writes right after a whole-VM
# snapshot (issue 33, acceptance 6), in a loop-mounted XFS with reflink made
# here. Each quiver (and quiver@BASE) serves a volume of one SNAPSIZE disk
# (default 4 GiB) filled with random data; nbdkit's file plugin serves a
# reflinked copy (cp --reflink=always) of the first quiver's disk image as
# it stands then (SNAPCOPY=image, the default: the same file, with the
# extent layout the earlier rounds' writes gave it), or of the plain file
# that filled the disks (SNAPCOPY=src: a fresh layout every round, the
# runs before 2026-12-07, 11:30). In each of SNAPROUNDS rounds (default 5),
# taking turns: quiver takes a snapshot of the volume (and deletes the one
# before), or the copy is made anew and nbdkit started on it, then fio
# writes SNAPIOS (default 2048) random 4k blocks at QD32 over unix. 2048
# writes over 4096 chunks of 1 MiB land about 80% on chunks not written
# since the snapshot, whose blocks are shared, as the copy's are with its
# source. Its tables follow the others, with the ratio quiver/nbdkit. Just
# that case:
#   CASES=none KINDS="quiver nbdkit" RAW=0 test/bench/nbd.sh
# PORT+20 and up are its API ports.
set -euo pipefail
RUNTIME=${1:-${RUNTIME:-}}
RUNTIME=${RUNTIME:-10}
ROUNDS=${ROUNDS:-3}
WORK=${2:-${DIR:-}}
WORK=${WORK:-$(mktemp -u /tmp/quiver-bench-nbd.XXXXXX)}
BASE=${BASE:-}
KINDS=${KINDS:-quiver endpoint nbdkit qemu-nbd encrypted}
TRANSPORTS=${TRANSPORTS:-unix tcp}
RAW=${RAW:-1}
PORT=${PORT:-20811}
if [ "${CASES:-}" = none ]; then
	CASELIST=()
elif [ -n "${CASES:-}" ]; then
	IFS=, read -r -a CASELIST <<<"$CASES"
else
	CASELIST=("randread 4k 1" "randread 4k 32" "randwrite 4k 1" "randwrite 4k 32" "read 1m 8" "write 1m 8")
fi
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
for t in fio nbdkit qemu-nbd nbdcopy nbdinfo curl git; do
	command -v $t >/dev/null || { echo "missing $t: apt-get install fio nbdkit qemu-utils libnbd-bin curl git" >&2; exit 1; }
done
mkdir "$WORK"
SIZE=$((1 << 30))
SNAPWRITE=${SNAPWRITE:-1}
SNAPSIZE=${SNAPSIZE:-$((4 << 30))}
SNAPIOS=${SNAPIOS:-2048}
SNAPROUNDS=${SNAPROUNDS:-5}
SNAPCOPY=${SNAPCOPY:-image}
case $SNAPCOPY in image | src) ;; *)
	echo "SNAPCOPY must be image or src, not $SNAPCOPY" >&2
	exit 2
	;;
esac
if [ "$SNAPWRITE" = 1 ] && { [ "$(id -u)" != 0 ] || ! command -v mkfs.xfs >/dev/null; }; then
	echo "skipping the writes after a snapshot (SNAPWRITE): they need root and mkfs.xfs" >&2
	SNAPWRITE=0
fi
SNAPMNT=
SERVERS=() # background processes to stop at the end
declare -A PID URI IMGOF HOP
cleanup() {
	# The endpoint's publication holds an immutable placeholder file
	# (disk.img, for KubeVirt) that only its unpublication removes.
	if [ -n "${HOP[endpoint]:-}" ]; then
		curl -sf --unix-socket "$WORK/ep.sock" -X DELETE http://endpoint/v1/volumes/bench >/dev/null 2>&1 ||
			chattr -i "$WORK"/ep/volumes/*/disk.img 2>/dev/null || true
	fi
	if [ -n "${EPBASE:-}" ] && [ -e "$WORK/ep-base.sock" ]; then
		curl -sf --unix-socket "$WORK/ep-base.sock" -X DELETE http://endpoint/v1/volumes/bench >/dev/null 2>&1 ||
			chattr -i "$WORK"/ep-base/volumes/*/disk.img 2>/dev/null || true
	fi
	for p in "${SERVERS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	if [ -n "$SNAPMNT" ]; then umount "$SNAPMNT" 2>/dev/null || umount -l "$SNAPMNT" || true; fi
	rm -rf "$WORK"
}
trap cleanup EXIT

echo "building quiver and nbdrun" >&2
(cd "$ROOT" && go build -o "$WORK/quiver" ./cmd/quiver && go build -o "$WORK/nbdrun" ./test/bench/nbdrun)
NBDRUN="$WORK/nbdrun"
TLSFLAGS=()
if [[ " $TRANSPORTS " == *" tls "* ]]; then
	# One CA and a server certificate for 127.0.0.1, in the layout nbdkit
	# and QEMU read (ca-cert.pem, server-cert.pem, server-key.pem); fio's
	# libnbd finds the CA in $HOME/.pki/libnbd, its default.
	command -v openssl >/dev/null || { echo "missing openssl (TRANSPORTS has tls)" >&2; exit 1; }
	PKI="$WORK/pki"
	mkdir -p "$PKI" "$WORK/home/.pki/libnbd"
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj "/CN=bench CA" \
		-keyout "$PKI/ca-key.pem" -out "$PKI/ca-cert.pem" 2>/dev/null
	openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=127.0.0.1" \
		-keyout "$PKI/server-key.pem" -out "$PKI/server.csr" 2>/dev/null
	printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$PKI/ext.cnf"
	openssl x509 -req -in "$PKI/server.csr" -CA "$PKI/ca-cert.pem" -CAkey "$PKI/ca-key.pem" -CAcreateserial \
		-days 2 -extfile "$PKI/ext.cnf" -out "$PKI/server-cert.pem" 2>/dev/null
	cp "$PKI/ca-cert.pem" "$WORK/home/.pki/libnbd/ca-cert.pem"
	TLSFLAGS=(--nbd-tls-cert "$PKI/server-cert.pem" --nbd-tls-key "$PKI/server-key.pem" --nbd-tls on)
fi
RESULTS="$WORK/results.tsv"
QUIVERS=()
if [[ " $KINDS " == *" quiver "* ]]; then QUIVERS+=(quiver); fi
if [ -n "$BASE" ]; then
	rev=$(git -C "$ROOT" rev-parse --verify --short "$BASE^{commit}")
	echo "building quiver at $BASE ($rev)" >&2
	mkdir "$WORK/src-base"
	git -C "$ROOT" archive "$rev" | tar -x -C "$WORK/src-base"
	(cd "$WORK/src-base" && go build -o "$WORK/quiver-base" ./cmd/quiver)
	QUIVERS+=("quiver@$BASE")
	KINDS="${KINDS/quiver /quiver quiver@$BASE }"
	[[ " $KINDS " == *" quiver@$BASE "* ]] || KINDS="$KINDS quiver@$BASE"
fi
EPBASE=${EPBASE:-}
if [ -n "$EPBASE" ]; then
	[[ " $KINDS " == *" endpoint "* ]] || { echo "EPBASE needs endpoint in KINDS" >&2; exit 1; }
	eprev=$(git -C "$ROOT" rev-parse --verify --short "$EPBASE^{commit}")
	echo "building the endpoint at $EPBASE ($eprev)" >&2
	mkdir "$WORK/src-epbase"
	git -C "$ROOT" archive "$eprev" | tar -x -C "$WORK/src-epbase"
	(cd "$WORK/src-epbase" && go build -o "$WORK/quiver-epbase" ./cmd/quiver)
	KINDS="$KINDS endpoint@$EPBASE"
fi
ALT=${ALT:-}
ALTFLAGS=()
if [ -n "$ALT" ]; then
	read -r -a ALTFLAGS <<<"${ALT#*:}"
	QUIVERS+=("quiver+${ALT%%:*}")
	KINDS="$KINDS quiver+${ALT%%:*}"
fi
if [[ " $KINDS " == *" encrypted "* ]]; then QUIVERS+=(encrypted); fi
[ ${#QUIVERS[@]} -gt 0 ] || { echo "KINDS must include quiver or BASE must be set: nbdkit and qemu-nbd serve quiver's image" >&2; exit 1; }

# The same random content for every quiver's disk, so reads hit data, not holes.
head -c $SIZE /dev/urandom >"$WORK/random.bin"
i=0
for q in "${QUIVERS[@]}"; do
	bin="$WORK/quiver" dir="$WORK/pool" sock="$WORK/quiver.sock" extra=()
	case $q in
	quiver) ;;
	quiver+*) dir="$WORK/pool-alt" sock="$WORK/quiver-alt.sock" extra=("${ALTFLAGS[@]}") ;;
	encrypted) dir="$WORK/pool-enc" sock="$WORK/quiver-enc.sock" extra=(--key-file "$WORK/keys.json") ;;
	*) bin="$WORK/quiver-base" dir="$WORK/pool-base" sock="$WORK/quiver-base.sock" ;;
	esac
	api=127.0.0.1:$((PORT + 10 + i)) nbd=$((PORT + 3 * i))
	"$bin" server --pool "$dir" --listen "$api" --nbd-listen "127.0.0.1:$nbd" --nbd-socket "$sock" "${TLSFLAGS[@]}" "${extra[@]}" --log-level warn &
	PID[$q]=$!
	SERVERS+=($!)
	for _ in $(seq 200); do curl -sf "http://$api/v1/pool" >/dev/null 2>&1 && break; sleep 0.05; done
	encflag=()
	[ "$q" = encrypted ] && encflag=(--encrypt)
	QUIVER_SERVER=http://$api "$bin" volume create bench --capacity 1Gi --disk disk=1Gi "${encflag[@]}" >/dev/null
	nbdcopy "$WORK/random.bin" "nbd://127.0.0.1:$nbd/bench/disk"
	IMGOF[$q]="$dir/volumes/bench/disks/disk.img"
	URI[$q/unix]="nbd+unix:///bench/disk?socket=$sock"
	URI[$q/tcp]="nbd://127.0.0.1:$nbd/bench/disk"
	URI[$q/tls]="nbds://127.0.0.1:$nbd/bench/disk"
	i=$((i + 1))
done
rm -f "$WORK/random.bin"
if [[ " $TRANSPORTS " != *" tcp "* ]]; then
	KINDS=" $KINDS "
	KINDS=${KINDS/ endpoint / } # measured against quiver over TCP only
	if [ -n "$EPBASE" ]; then KINDS=${KINDS/ endpoint@$EPBASE / }; fi
	KINDS=${KINDS/ proxy / }
fi
if [[ " $KINDS " == *" endpoint "* || " $KINDS " == *" proxy "* ]]; then
	[[ " ${QUIVERS[*]} " == *" quiver "* ]] || { echo "KINDS with endpoint or proxy needs quiver: they forward to it" >&2; exit 1; }
	# One attachment for the endpoint and quiver's direct runs alike: the
	# same export name with the same token on both paths, one writer.
	api=http://127.0.0.1:$((PORT + 10))
	token=$(QUIVER_SERVER=$api "$WORK/quiver" attach create bench bench-node -o json |
		sed -n 's/^ *"token": *"\([^"]*\)".*/\1/p')
	[ -n "$token" ] || { echo "no attachment token for the endpoint" >&2; exit 1; }
fi
if [[ " $KINDS " == *" proxy "* ]]; then
	nbdkit --exit-with-parent -f -U "$WORK/proxy.sock" nbd uri="nbd://127.0.0.1:$PORT/bench/disk/$token" &
	HOP[proxy]=$!
	SERVERS+=($!)
	PID[proxy]=${PID[quiver]}
	URI[proxy/tcp]="nbd+unix:///?socket=$WORK/proxy.sock"
fi
# start_endpoint KIND BINARY NAME: an endpoint publishing quiver's volume
# with the token, on $WORK/NAME.sock and root $WORK/NAME.
start_endpoint() {
	local kind=$1 bin=$2 name=$3
	"$bin" endpoint --servers "$api" --root "$WORK/$name" --control "$WORK/$name.sock" \
		--fuse-root "$WORK/fuse-$name" --log-level warn &
	HOP[$kind]=$!
	SERVERS+=($!)
	PID[$kind]=${PID[quiver]}
	for _ in $(seq 200); do curl -sf --unix-socket "$WORK/$name.sock" http://endpoint/v1/volumes >/dev/null 2>&1 && break; sleep 0.05; done
	pub=$(curl -sSf --unix-socket "$WORK/$name.sock" -X PUT -H 'Content-Type: application/json' \
		-d "{\"name\":\"bench\",\"token\":\"$token\",\"disks\":[{\"name\":\"disk\",\"size\":$SIZE}]}" \
		http://endpoint/v1/volumes/bench)
	epsock=$(sed -n 's/.*"socket": *"\([^"]*\)".*/\1/p' <<<"$pub")
	[ -n "$epsock" ] || { echo "the endpoint's publication answered $pub" >&2; exit 1; }
	URI[$kind/tcp]="nbd+unix:///disk?socket=$epsock"
}
if [[ " $KINDS " == *" endpoint "* ]]; then
	start_endpoint endpoint "$WORK/quiver" ep
	if [ -n "$EPBASE" ]; then start_endpoint "endpoint@$EPBASE" "$WORK/quiver-epbase" ep-base; fi
fi
if [ -n "${token:-}" ]; then
	for tr in unix tcp tls; do URI[quiver/$tr]="${URI[quiver/$tr]}/$token"; done
fi
sync
IMG=${IMGOF[${QUIVERS[0]}]}

# start_peers TRANSPORT: starts nbdkit and qemu-nbd on that transport. They
# serve the first quiver's image; all servers run at once, so that the runs
# of a case can take turns: the machine's speed drifts over minutes, and
# alternating spreads the drift over every server.
start_peers() {
	local tr=$1
	if [[ " $KINDS " == *" nbdkit "* ]]; then
		if [ "$tr" = unix ]; then
			nbdkit --exit-with-parent -f -U "$WORK/nbdkit.sock" file "$IMG" &
		elif [ "$tr" = tls ]; then
			nbdkit --exit-with-parent -f -i 127.0.0.1 -p $((PORT + 1)) --tls=require --tls-certificates="$PKI" file "$IMG" &
		else
			nbdkit --exit-with-parent -f -i 127.0.0.1 -p $((PORT + 1)) file "$IMG" &
		fi
		PID[nbdkit]=$!
		SERVERS+=($!)
		URI[nbdkit/unix]="nbd+unix:///?socket=$WORK/nbdkit.sock"
		URI[nbdkit/tcp]="nbd://127.0.0.1:$((PORT + 1))/"
		URI[nbdkit/tls]="nbds://127.0.0.1:$((PORT + 1))/"
	fi
	if [[ " $KINDS " == *" qemu-nbd "* ]]; then
		if [ "$tr" = unix ]; then
			qemu-nbd -f raw --cache=none --aio=native -t -e 8 -k "$WORK/qemu.sock" "$IMG" &
		elif [ "$tr" = tls ]; then
			qemu-nbd -f raw --cache=none --aio=native -t -e 8 -b 127.0.0.1 -p $((PORT + 2)) \
				--object "tls-creds-x509,id=tls0,dir=$PKI,endpoint=server,verify-peer=off" --tls-creds tls0 "$IMG" &
		else
			qemu-nbd -f raw --cache=none --aio=native -t -e 8 -b 127.0.0.1 -p $((PORT + 2)) "$IMG" &
		fi
		PID[qemu-nbd]=$!
		SERVERS+=($!)
		URI[qemu-nbd/unix]="nbd+unix:///?socket=$WORK/qemu.sock"
		URI[qemu-nbd/tcp]="nbd://127.0.0.1:$((PORT + 2))/"
		URI[qemu-nbd/tls]="nbds://127.0.0.1:$((PORT + 2))/"
	fi
	if [[ " $KINDS " == *" null "* ]]; then
		# nbdkit's null plugin answers without any I/O: what one NBD round
		# trip costs on this machine whatever the server does (the floor
		# for QD1 latency, issue 18's target 3). Reads return zeros; writes
		# are dropped.
		if [ "$tr" = unix ]; then
			nbdkit --exit-with-parent -f -U "$WORK/null.sock" null size=$SIZE &
		elif [ "$tr" = tls ]; then
			nbdkit --exit-with-parent -f -i 127.0.0.1 -p $((PORT + 9)) --tls=require --tls-certificates="$PKI" null size=$SIZE &
		else
			nbdkit --exit-with-parent -f -i 127.0.0.1 -p $((PORT + 9)) null size=$SIZE &
		fi
		PID[null]=$!
		SERVERS+=($!)
		URI[null/unix]="nbd+unix:///?socket=$WORK/null.sock"
		URI[null/tcp]="nbd://127.0.0.1:$((PORT + 9))/"
		URI[null/tls]="nbds://127.0.0.1:$((PORT + 9))/"
	fi
	sleep 1
}
stop_peers() {
	for k in nbdkit qemu-nbd null; do
		if [ -n "${PID[$k]:-}" ]; then
			kill "${PID[$k]}"
			wait "${PID[$k]}" 2>/dev/null || true
			unset "PID[$k]"
		fi
	done
}

read -r -a kinds <<<"$KINDS"
[ "$RAW" = 1 ] && kinds+=(raw)
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
for tr in $TRANSPORTS; do
	start_peers "$tr"
	for c in "${CASELIST[@]}"; do
		set -- $c
		for round in $(seq "$ROUNDS"); do
			n=${#kinds[@]}
			for j in $(seq 0 $((n - 1))); do
				kind=${kinds[$(((j + round - 1) % n))]}
				# The hops are measured against quiver over TCP only.
				[[ "$kind" = endpoint* || "$kind" = proxy ]] && [ "$tr" != tcp ] && continue
				# Every run starts with the files in the page cache:
				# qemu-nbd's O_DIRECT writes evict them, which would
				# penalise whoever runs next.
				for q in "${QUIVERS[@]}"; do cat "${IMGOF[$q]}" >/dev/null; done
				if [ "$kind" = raw ]; then
					"$NBDRUN" run -out "$RESULTS" -kind raw -transport file -target "$IMG" \
						-rw "$1" -bs "$2" -qd "$3" -runtime "$RUNTIME"
				else
					HOME=$([ "$tr" = tls ] && echo "$WORK/home" || echo "$HOME") \
						"$NBDRUN" run -out "$RESULTS" -kind "$kind" -transport "$tr" -pid "${PID[$kind]}" -hop "${HOP[$kind]:-0}" \
						-target "${URI[$kind/$tr]}" -rw "$1" -bs "$2" -qd "$3" -runtime "$RUNTIME"
				fi
			done
		done
	done
	stop_peers
done

# snapwrite: the writes right after a whole-VM snapshot (SNAPWRITE above),
# into their own results file.
SNAPRESULTS="$WORK/snapwrite.tsv"
snapwrite() {
	local mnt="$WORK/xfs" img="$WORK/xfs.img" firstimg="" q bin dir src api sock ksock i r j n kind extra encflag
	truncate -s $((6 * SNAPSIZE + (4 << 30))) "$img"
	mkfs.xfs -q -m reflink=1 "$img"
	mkdir "$mnt"
	mount -o loop "$img" "$mnt"
	SNAPMNT=$mnt
	declare -A SAPI SSOCK SPID
	i=0
	for q in "${QUIVERS[@]}"; do
		bin="$WORK/quiver" dir="$mnt/pool" sock="$WORK/snap.sock" extra=() encflag=()
		case $q in
		quiver) ;;
		quiver+*) dir="$mnt/pool-alt" sock="$WORK/snap-alt.sock" ;;
		encrypted) dir="$mnt/pool-enc" sock="$WORK/snap-enc.sock" extra=(--key-file "$WORK/snap-keys.json") encflag=(--encrypt) ;;
		*) bin="$WORK/quiver-base" dir="$mnt/pool-base" sock="$WORK/snap-base.sock" ;;
		esac
		api=127.0.0.1:$((PORT + 20 + i))
		"$bin" server --pool "$dir" --listen "$api" --nbd-listen "" --nbd-socket "$sock" "${extra[@]}" --log-level warn &
		SPID[$q]=$!
		SERVERS+=($!)
		for _ in $(seq 200); do curl -sf "http://$api/v1/pool" >/dev/null 2>&1 && break; sleep 0.05; done
		QUIVER_SERVER=http://$api "$bin" volume create snapw --capacity "$SNAPSIZE" --disk "disk=$SNAPSIZE" "${encflag[@]}" >/dev/null
		SAPI[$q]=$api SSOCK[$q]=$sock
		[ -n "$firstimg" ] || firstimg="$dir/volumes/snapw/disks/disk.img"
		i=$((i + 1))
	done
	head -c "$SNAPSIZE" /dev/urandom >"$mnt/src.img"
	for q in "${QUIVERS[@]}"; do
		nbdcopy "$mnt/src.img" "nbd+unix:///snapw/disk?socket=${SSOCK[$q]}"
	done
	sync
	local skinds=() k
	for k in "${QUIVERS[@]}"; do [[ " $KINDS " == *" $k "* ]] && skinds+=("$k"); done
	[[ " $KINDS " == *" nbdkit "* ]] && skinds+=(nbdkit)
	for r in $(seq "$SNAPROUNDS"); do
		n=${#skinds[@]}
		for j in $(seq 0 $((n - 1))); do
			kind=${skinds[$(((j + r - 1) % n))]}
			if [ "$kind" = nbdkit ]; then
				rm -f "$mnt/copy.img"
				# The first quiver's image, as the rounds before left it;
				# or the plain file that filled it.
				src=$firstimg
				[ "$SNAPCOPY" = src ] && src="$mnt/src.img"
				cp --reflink=always "$src" "$mnt/copy.img"
				sync
				# A new socket each round: nbdkit needs a path nobody holds.
				ksock="$WORK/snapkit-$r.sock"
				nbdkit --exit-with-parent -f -U "$ksock" file "$mnt/copy.img" &
				SPID[nbdkit]=$!
				for _ in $(seq 200); do nbdinfo --size "nbd+unix:///?socket=$ksock" >/dev/null 2>&1 && break; sleep 0.05; done
				"$NBDRUN" run -out "$SNAPRESULTS" -kind nbdkit -transport unix -pid "${SPID[nbdkit]}" \
					-target "nbd+unix:///?socket=$ksock" -rw randwrite -bs 4k -qd 32 \
					-size "$SNAPSIZE" -ios "$SNAPIOS"
				kill "${SPID[nbdkit]}"
				wait "${SPID[nbdkit]}" 2>/dev/null || true
				continue
			fi
			bin="$WORK/quiver"
			[[ "$kind" == quiver@* ]] && bin="$WORK/quiver-base"
			QUIVER_SERVER=http://${SAPI[$kind]} "$bin" snapshot create snapw "s$r" >/dev/null
			if [ "$r" -gt 1 ]; then
				QUIVER_SERVER=http://${SAPI[$kind]} "$bin" snapshot delete snapw "s$((r - 1))" >/dev/null
			fi
			sync
			"$NBDRUN" run -out "$SNAPRESULTS" -kind "$kind" -transport unix -pid "${SPID[$kind]}" \
				-target "nbd+unix:///snapw/disk?socket=${SSOCK[$kind]}" -rw randwrite -bs 4k -qd 32 \
				-size "$SNAPSIZE" -ios "$SNAPIOS"
		done
	done
}
if [ "$SNAPWRITE" = 1 ]; then
	echo "writes right after a snapshot, on a loop-mounted XFS" >&2
	snapwrite
fi

echo
echo "fio $(fio --version), nbdkit $(nbdkit --version | cut -d' ' -f2), $(qemu-nbd --version | head -1), $(nproc) cores," \
	"file on $(findmnt -n -o FSTYPE --target "$WORK"), quiver $(git -C "$ROOT" describe --always --dirty)${BASE:+ and $BASE}${EPBASE:+ (endpoint also at $EPBASE)}${ALT:+ (quiver+${ALT%%:*}: ${ALT#*:})}," \
	"${HOP[endpoint]:+endpoint: fio on the unix socket of quiver endpoint, forwarding to quiver over TCP loopback,}" \
	"${RUNTIME}s per run, $ROUNDS rounds, load average $LOAD_START at the start and $(cut -d' ' -f1-3 /proc/loadavg) at the end"
if [ -s "$RESULTS" ]; then "$NBDRUN" report "$RESULTS"; fi
if [ -s "$SNAPRESULTS" ]; then
	echo
	echo "## Writes right after a whole-VM snapshot (issue 33, acceptance 6): loop-mounted XFS with reflink," \
		"$((SNAPSIZE >> 30)) GiB disk filled, then $SNAPIOS random 4k writes at QD32 over unix; nbdkit on a reflinked copy" \
		"of $([ "$SNAPCOPY" = src ] && echo "the file that filled the disks" || echo "quiver's disk image as it stands")" \
		"(target: quiver/nbdkit throughput at least 1.0x)"
	"$NBDRUN" report "$SNAPRESULTS"
fi
