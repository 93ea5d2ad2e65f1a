# quiver: the targets people expect. `make run` starts a server on the
# embedded default (pool ./quiver-data, API on 127.0.0.1:7480); `make test`
# runs every test.
GO      ?= go
BIN     ?= bin/quiver
PKGS    ?= ./...

.PHONY: console console-screenshots helm man all build image run test test-race e2e-k8s test-short lint fuzz bench bench-nbd bench-nbd-tls bench-nbd-encrypted bench-cluster bench-qos bench-storm bench-backup bench-dr proto clean mutate-syncs

all: build

# The version and commit `quiver version` prints.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS ?= -X github.com/quiverstorage/quiver/internal/buildinfo.Version=$(VERSION) \
	-X github.com/quiverstorage/quiver/internal/buildinfo.Commit=$(COMMIT)

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/quiver

# The quiver image (docs/image.md): a Debian root filesystem made by
# mmdebstrap (build/image/rootfs.sh, cached by its package list) and a static
# quiver, assembled without a daemon by the Go program in build/image (a
# module of its own) into a docker-archive tarball, IMAGE_TAR, tagged
# IMAGE:VERSION. Its times are the commit's: the assembly from the same
# inputs gives the same image ID. Load it with `podman load -i` (or docker
# load, ctr images import). IMAGE_WORK holds the parts: the static quiver,
# the root filesystem and the assembling program.
IMAGE             ?= quiver
IMAGE_TAR         ?= bin/quiver-image-$(VERSION).tar
IMAGE_WORK        ?= bin/image
IMAGE_SOURCE      ?= https://github.com/quiverstorage/quiver
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

image:
	@mkdir -p $(IMAGE_WORK) $(dir $(IMAGE_TAR))
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(IMAGE_WORK)/quiver ./cmd/quiver
	build/image/rootfs.sh $(IMAGE_WORK)/rootfs.tar
	$(GO) build -C build/image -trimpath -o $(abspath $(IMAGE_WORK))/assemble .
	$(IMAGE_WORK)/assemble -base $(IMAGE_WORK)/rootfs.tar -add $(IMAGE_WORK)/quiver:/usr/bin/quiver \
		-entrypoint /usr/bin/quiver -created $(SOURCE_DATE_EPOCH) \
		-label org.opencontainers.image.version=$(VERSION) \
		-label org.opencontainers.image.revision=$(COMMIT) \
		-label org.opencontainers.image.source=$(IMAGE_SOURCE) \
		-tag $(IMAGE):$(VERSION) -o $(IMAGE_TAR)
	@echo "$(IMAGE):$(VERSION) in $(IMAGE_TAR)"

# The web console (docs/console.md): its sources in web/console, built with
# npm (Node.js 20.19 or later) into internal/console/dist, which is committed
# and embedded in the binary, so `make build` needs no npm. Run it after a
# change to web/console and commit the new dist (and source.sha256 beside
# it: internal/console's TestDistIsCurrent fails on sources changed since).
console:
	cd web/console && npm ci --no-audit --no-fund && npm run build
	$(GO) test -count=1 -run TestDistIsCurrent ./internal/console/ -update

# The console's browser tests (test/console) with their screenshots saved
# in docs/ui, for the docs and the README. Needs chromium.
console-screenshots:
	QUIVER_UI_SCREENSHOTS=1 $(GO) test -count=1 ./test/console/

# Man pages of every command, generated from the command tree, in man/.
man: build
	./$(BIN) man --dir man

run: build
	./$(BIN) server

# Every test, with the race detector. Tests that need root, loop-mounted
# filesystems or external tools (qemu-img, nbdinfo, fio, ...) skip when those
# are missing, and fail instead when CI is set. The live-migration test runs
# last and alone: its guests run under TCG and are CPU-bound (its guest RAM
# size keeps QEMU 7.2 off a TCG migration bug: docs/live-migration.md). The
# power-cut test runs alone before it: its guests take both cores
# (docs/durability.md). The cluster test runs alone and without the race
# detector: its failover cycles (20 kills with fio verify, 10 partitions,
# issue 15) take about 6 minutes so, and three times as long with three race-built
# servers and embedded etcd members (docs/cluster.md, "Tests"); the
# cluster, replica and forward packages run with it above. The history
# checker over a fault schedule (test/history, issue 29) runs alone and
# without the race detector too: 30 cycles, about 5 minutes.
# The web console's 10,000-volume list (test/console) runs once more
# without the race detector, for its 1 s bound (docs/console.md).
# scripts/gotest is go test that ends a failed run with a summary of what
# failed, so a log cut to its tail still names it.
GOTEST  ?= GO=$(GO) scripts/gotest

test: lint
	$(GOTEST) -race -count=1 -timeout 30m $$($(GO) list $(PKGS) | grep -v -e /test/migration$$ -e /test/powercut$$ -e /test/cluster$$ -e /test/history$$)
	$(GOTEST) -count=1 -timeout 30m ./test/cluster/
	$(GOTEST) -count=1 -run TestHistory -timeout 40m ./test/history/
	$(GOTEST) -race -count=1 -timeout 20m ./test/powercut/
	$(GOTEST) -race -count=1 -timeout 10m ./test/migration/
	$(GOTEST) -count=1 -run 'TestHotPathAllocations' ./internal/nbd/  # sync.Pool drops items under -race
	$(GOTEST) -count=1 -run 'TestConsoleManyVolumes' ./test/console/  # the 1 s bound of 10,000 volumes holds for a server without -race

test-race: test

# The end-to-end test on a real one-node Kubernetes built here (test/k8s,
# docs/k8s-e2e.md): builds the Kubernetes binaries, CoreDNS and the CSI
# sidecars into a cache by version (tens of minutes cold on 2 cores; nothing
# the second time), the images, and runs it. `make test` runs it only when
# the binaries are already cached.
e2e-k8s:
	scripts/e2e-bins >/dev/null
	QUIVER_E2E_K8S=1 $(GOTEST) -count=1 -timeout 60m -v ./test/k8s/

# The mutation check of docs/durability.md: every sync point switched off in
# turn must make a durability test fail.
mutate-syncs:
	scripts/mutate-syncs

test-short:
	$(GO) test -short -count=1 $(PKGS)

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	$(GO) vet -C build/image ./...  # a module of its own: ./... does not reach it

# Every fuzz target (func FuzzXxx in a _test.go file), one after the other,
# each for FUZZTIME. Crashers land in the package's testdata/fuzz/<FuzzXxx>/.
FUZZTIME         ?= 30s
FUZZMINIMIZETIME ?= 5s

fuzz:
	@set -e; for file in $$(grep -rl --include='*_test.go' '^func Fuzz' cmd internal); do \
		dir=./$$(dirname $$file); \
		for name in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$file); do \
			echo "fuzz $$dir $$name for $(FUZZTIME)"; \
			$(GO) test -run='^$$' -fuzz="^$$name\$$" -fuzztime=$(FUZZTIME) \
				-fuzzminimizetime=$(FUZZMINIMIZETIME) $$dir; \
		done; \
	done

# Benchmarks measure and print; they never assert. The storage core's need
# root (loop mounts); those of scale (nbdinfo --list of 1,000 exports,
# /metrics of 500 volumes, docs/benchmarks.md) need nbdinfo (and nbdkit
# for its side of the listing).
bench: build
	cd test/bench && QUIVER_BENCH=1 $(GO) test -count=1 -timeout 60m -run Benchmark -v .

# NBD data path: quiver vs nbdkit vs qemu-nbd vs the raw file, same content,
# same client (fio's nbd engine); server CPU and context switches per
# request, IOPS, MB/s, QD1 latency. RUNTIME seconds per run, ROUNDS runs per
# case alternating between servers; DIR (must not exist) on the filesystem
# to measure, e.g. a mounted XFS (default: a new directory in /tmp).
# BASE=<git rev>: also quiver built at that revision, in the same rounds
# (A/B). Over TCP also the compute node's endpoint (issue 30): fio on the
# unix socket of `quiver endpoint`, forwarding to the same quiver, against
# fio straight to quiver; the report ends with its ratios and a verdict
# against acceptance 6; EPBASE=<git rev> also runs the endpoint built at
# that revision (A/B of the endpoint alone). KINDS, TRANSPORTS, CASES from
# the environment pick a subset. See test/bench/nbd.sh.
bench-nbd:
	RUNTIME="$(RUNTIME)" ROUNDS="$(ROUNDS)" DIR="$(DIR)" BASE="$(BASE)" EPBASE="$(EPBASE)" test/bench/nbd.sh

# Encryption at rest (issue 35, acceptance 5): the cipher's benchmarks
# (internal/crypt, one core: the assembly path and the Go fallback), then
# quiver serving an encrypted volume (--key-file, --encrypt) against plain
# quiver over a unix socket (TRANSPORTS may say "unix tcp"), side by side in
# the same rounds; the report ends with ratios encrypted/plain and a
# verdict. make bench-nbd runs the encrypted kind too, among the others.
bench-nbd-encrypted:
	cd internal/crypt && $(GO) test -count=1 -run '^$$' -bench . -benchtime 2s .
	RUNTIME="$(RUNTIME)" ROUNDS="$(ROUNDS)" DIR="$(DIR)" BASE="$(BASE)" KINDS="quiver encrypted" TRANSPORTS="$(or $(TRANSPORTS),unix)" RAW=0 SNAPWRITE=0 \
		CASES="randread 4k 1,randwrite 4k 1,randread 4k 32,randwrite 4k 32,read 1m 8,write 1m 8" test/bench/nbd.sh

# NBD over TLS against plain TCP, in one run: quiver (--nbd-tls on), nbdkit
# (--tls=require) and qemu-nbd (tls-creds-x509), 4k random reads at QD32 and
# 1 MiB reads and writes. BASE=<git rev>: also quiver at that revision (A/B).
bench-nbd-tls:
	RUNTIME="$(RUNTIME)" ROUNDS="$(ROUNDS)" DIR="$(DIR)" BASE="$(BASE)" TRANSPORTS="tcp tls" RAW=0 \
		CASES="randread 4k 32,read 1m 8,write 1m 8" test/bench/nbd.sh

# Cluster (issue 15, acceptance 8): three nodes in network namespaces as
# test/cluster runs them (root); a replicas=2 volume against a replicas=1
# volume side by side (fio nbd engine: 4k randwrite QD1 and QD32, 1 MiB
# writes QD8; ROUNDS rounds of RUNTIME seconds, alternating), the resync of
# a copy that was down under writes, and KILLS failovers (SIGKILL of the
# primary to the client's next acknowledged write, median). About 6 minutes
# with the defaults (ROUNDS=3, RUNTIME=10, KILLS=5). Not part of make test
# (TestBenchCluster skips without QUIVER_BENCH).
bench-cluster:
	QUIVER_BENCH=1 QUIVER_BENCH_RUNTIME=$(RUNTIME) QUIVER_BENCH_ROUNDS=$(ROUNDS) QUIVER_BENCH_KILLS=$(KILLS) \
		$(GO) test -count=1 -timeout 60m -run '^TestBenchCluster$$' -v ./test/cluster/

# QoS path overhead: one unlimited volume served with and without metrics and
# QoS, side by side in one process, driven by fio (nbd engine, unix socket),
# runs alternating. RUNTIME seconds per run (default 10), ROUNDS runs per case.
# Then the cost of the wrapper alone, per request, without NBD.
bench-qos:
	cd test/qos && QUIVER_BENCH=1 QUIVER_BENCH_RUNTIME=$(RUNTIME) QUIVER_BENCH_ROUNDS=$(ROUNDS) \
		$(GO) test -count=1 -timeout 60m -run TestQoSOverhead -v .
	cd test/qos && $(GO) test -run '^$$' -bench DiskPath -count 5 .

# Provisioning storm: VMS VMs x DISKS disks through the CSI controller, in
# process, against a real server: one CreateVolume and one CreateSnapshot per
# VM (quiver) against one per disk (today's drivers), side by side. DIR: the
# pool's parent directory (default /tmp). PHASES=create: the creates only;
# ROUNDS=N: N rounds, with each round's ratio and their median. Prints, never
# asserts.
bench-storm:
	cd test/storm && QUIVER_BENCH=1 QUIVER_STORM_VMS=$(VMS) QUIVER_STORM_DISKS=$(DISKS) \
		QUIVER_STORM_WORKERS=$(WORKERS) QUIVER_BENCH_DIR=$(DIR) \
		QUIVER_STORM_PHASES=$(PHASES) QUIVER_STORM_ROUNDS=$(ROUNDS) \
		$(GO) test -count=1 -timeout 120m -run TestProvisioningStorm -v .

# Backup (issue 33, acceptance 5): quiver backup against restic (Debian's
# package), side by side in one run, same bytes, same S3 server (tests3, in
# memory): a 3-disk VM of VM_MIB MiB (default 8192) written full through NBD,
# backed up full, 1% changed in scattered writes, backed up again, restored;
# then CLONES (default 100) clones of a GOLDEN_MIB MiB golden image (default
# 1024) backed up into a repository of their own. Root (a loop-mounted XFS,
# the page cache dropped before each step); 26 minutes with the defaults on a
# loaded 2-core machine (docs/benchmarks.md). PPROF=DIR: CPU profiles of the
# server and of the S3 server, per step.
# Prints the figures, the ratios and each goal met or missed; never asserts.
# DR's delta shipping and the lowest RPO held at 10, 50 and 100 MB/s of
# writes (issue 34, test/bench/dr_test.go); DR_SECONDS a rate, DR_RATES.
DR_SECONDS ?= 60
DR_RATES ?= 10,50,100
bench-dr:
	cd test/bench && QUIVER_BENCH=1 QUIVER_BENCH_DR_SECONDS=$(DR_SECONDS) QUIVER_BENCH_DR_RATES=$(DR_RATES) \
		$(GO) test -count=1 -timeout 30m -run '^TestBenchDR$$' -v .

bench-backup:
	cd test/bench && QUIVER_BENCH=1 QUIVER_BENCH_VM_MIB=$(VM_MIB) QUIVER_BENCH_GOLDEN_MIB=$(GOLDEN_MIB) \
		QUIVER_BENCH_CLONES=$(CLONES) QUIVER_BENCH_PPROF=$(if $(PPROF),$(abspath $(PPROF))) \
		$(GO) test -count=1 -timeout 60m -run '^TestBenchBackup$$' -v .

# KubeVirt's hook sidecar API (internal/kubevirt/hookapi) and the csi-addons
# Identity and Replication services (internal/csiaddons): Go code from the
# .proto files, committed. Needs protoc (Debian protobuf-compiler); the two
# plugins are built into bin/ at pinned versions.
PROTOC_GEN_GO_GRPC ?= v1.6.2
proto:
	GOBIN=$(CURDIR)/bin $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go
	GOBIN=$(CURDIR)/bin $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC)
	cd internal/kubevirt/hookapi && for f in info/info.proto v1alpha2/callbacks.proto v1alpha3/callbacks.proto; do \
		protoc --plugin=protoc-gen-go=$(CURDIR)/bin/protoc-gen-go \
			--plugin=protoc-gen-go-grpc=$(CURDIR)/bin/protoc-gen-go-grpc \
			--go_out=. --go_opt=paths=source_relative \
			--go-grpc_out=. --go-grpc_opt=paths=source_relative $$f || exit 1; \
	done
	cd internal/csiaddons && for f in identity/identity.proto replication/replication.proto; do \
		protoc --plugin=protoc-gen-go=$(CURDIR)/bin/protoc-gen-go \
			--plugin=protoc-gen-go-grpc=$(CURDIR)/bin/protoc-gen-go-grpc \
			--go_out=. --go_opt=paths=source_relative \
			--go-grpc_out=. --go-grpc_opt=paths=source_relative $$f || exit 1; \
	done

# The Helm CLI, built from helm.sh/helm/v4 at the version build/helm/go.mod
# pins into $QUIVER_E2E_CACHE (default ~/.cache/quiver-e2e)/helm-<version>/,
# only when absent; prints its path. The chart's tests and make e2e-k8s use it.
helm:
	@GO=$(GO) scripts/helm

clean:
	rm -rf bin
