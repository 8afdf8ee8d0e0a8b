# luaop: the two commands of the README are `make dev` and `make test`.
SHELL := /bin/bash
CACHE ?= $(or $(LUAOP_CACHE),$(HOME)/.cache/luaop)
BIN := $(CURDIR)/bin
GO_TEST_FLAGS ?= -race -count=1 -timeout 40m

.PHONY: dev test test-node test-sharding unit lint cluster cluster-down node node-down build install image image-archive release bench bench-daemons bench-sleep bench-sharding bench-reload soak chaos faults fuzz

# The version printed by `luaop --version` and `luaop version`.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS := -X main.version=$(VERSION)

build:
	go build -ldflags "$(LDFLAGS)" -o $(BIN)/luaop ./cmd/luaop

# luaop into GOBIN (go env GOBIN, else GOPATH/bin), stamped as make build stamps it.
install:
	go install -ldflags "$(LDFLAGS)" ./cmd/luaop

# A release in dist/ (about 2 minutes a platform on 2 cores once the modules are
# cached): luaop for linux and darwin, amd64 and arm64, static (CGO off), stamped with
# VERSION (git describe; VERSION=v0.2.0 to name it), as dist/luaop-VERSION-OS-ARCH; an
# image archive for each linux platform (dist/luaop-image-VERSION-linux-ARCH.tar, named
# luaop:VERSION, without Docker); a CycloneDX SBOM of each binary (cyclonedx-gomod, with
# the patched gopher-lua added as what it is); dist/SHA256SUMS of them all (sha256sum -c
# SHA256SUMS checks them); and dist/provenance.intoto.json, an unsigned SLSA v1
# provenance of every artifact. A tagged release also needs `git tag VERSION`
# (CHANGELOG.md says how).
RELEASE_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
DIST ?= dist
release:
	@set -euo pipefail; rm -rf $(DIST); mkdir -p $(DIST); \
	for p in $(RELEASE_PLATFORMS); do \
	  os=$${p%/*}; arch=$${p#*/}; out=$(DIST)/luaop-$(VERSION)-$$os-$$arch; \
	  echo "[release] $$out"; \
	  CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch go build -trimpath -ldflags "-s -w $(LDFLAGS)" -o $$out ./cmd/luaop; \
	  echo "[release] $$out.cdx.json (SBOM)"; \
	  CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch go tool -modfile=tools/go.mod cyclonedx-gomod app -json -licenses -main cmd/luaop -output $$out.cdx.json . 2>/dev/null; \
	  go run ./cmd/luaop-release sbom -in $$out.cdx.json; \
	  if [ "$$os" = linux ]; then \
	    echo "[release] $(DIST)/luaop-image-$(VERSION)-linux-$$arch.tar"; \
	    go run ./cmd/luaop-image -arch $$arch -binary $$out -version $(VERSION) -t luaop:$(VERSION) -o $(DIST)/luaop-image-$(VERSION)-linux-$$arch.tar; \
	  fi; \
	done; \
	(cd $(DIST) && sha256sum luaop-* > SHA256SUMS); \
	go run ./cmd/luaop-release provenance -dist $(DIST) -version $(VERSION) -platforms "$(RELEASE_PLATFORMS)"; \
	echo "[release] $(DIST)/provenance.intoto.json"; cat $(DIST)/SHA256SUMS

# The image, stamped with the same version (IMAGE=registry/luaop:tag to name it).
IMAGE ?= luaop:latest
image:
	docker build --build-arg VERSION=$(VERSION) -t $(IMAGE) .

# The same image without Docker (cmd/luaop-image): an image archive for `ctr images
# import`, `kind load image-archive` or `docker load`. HANDLERS=scripts/examples bakes
# handlers into /scripts (none by default, as the Dockerfile's HANDLERS).
IMAGE_ARCHIVE ?= $(BIN)/luaop-image.tar
HANDLERS ?=
image-archive:
	go run ./cmd/luaop-image -o $(IMAGE_ARCHIVE) -t $(IMAGE) -version $(VERSION) $(if $(HANDLERS),-handlers $(HANDLERS))

# The developer loop: the example CRDs and objects applied (server-side, by luaop dev
# --apply: no kubectl) and the example handlers running, on the cluster KUBECONFIG
# names; without KUBECONFIG, on a local control plane, built (once) and started here.
dev: build
	@set -euo pipefail; \
	if [ -z "$${KUBECONFIG:-}" ]; then localcluster/deps.sh; KUBECONFIG="$$(localcluster/up.sh)"; export KUBECONFIG; fi; \
	echo "[dev] cluster: $$KUBECONFIG"; \
	exec $(BIN)/luaop dev --apply scripts/examples/crds --apply scripts/examples/objects scripts/examples

# The whole test suite against a dedicated local control plane, started and stopped here,
# after the linters; the deploy suite (e2e/node) on a second cluster with a node
# (localcluster/with-node.sh: skipped, saying why, where no node can run).
test: lint
	localcluster/with-cluster.sh localcluster/with-node.sh go test $(GO_TEST_FLAGS) ./...

# The deploy suite alone, on a cluster with a node (built once, then cached).
test-node:
	localcluster/with-node.sh go test $(GO_TEST_FLAGS) -v ./e2e/node

# Sharding across replicas at the issue's scale: three `luaop run` processes on 3,000
# widgets (the default suite runs the same test on 300). About 6 to 8 minutes here.
SHARD_OBJECTS ?= 3000
test-sharding:
	LUAOP_E2E_SHARD_OBJECTS=$(SHARD_OBJECTS) localcluster/with-cluster.sh go test -count=1 -timeout 40m -v -run TestShardingAcrossReplicas ./e2e

# go vet and staticcheck (pinned in tools/go.mod, built into bin/), both must be clean.
# staticcheck leaves out third_party/ (gopher-lua as published, plus luaop's patches):
# its upstream style is kept, so that the patches stay small and reviewable. go vet
# covers it (it reports on a package of the module when vetting its importers).
# deploy/components/prometheus's rule is parsed by Prometheus's own parser (promtool's),
# in a module of its own (tools/promcheck): none of Prometheus's dependencies reach
# luaop's go.mod.
OWN_PACKAGES = $(shell go list ./... | grep -v /third_party/)
lint:
	go vet ./...
	go build -C tools -o $(BIN)/staticcheck honnef.co/go/tools/cmd/staticcheck
	$(BIN)/staticcheck $(OWN_PACKAGES)
	go test -C tools/promcheck -count=1 ./...

# Pure-logic tests only: no cluster needed.
unit: lint
	LUAOP_TEST_NO_CLUSTER=1 go test $(GO_TEST_FLAGS) ./...

# Go's native fuzzing of the Lua entry points the budgets guard (RELIABILITY.md,
# "Adversarial scripts"): compiling, pattern matching, a handler call, luaop.json and
# luaop.yaml, the conversion of values. Each target runs FUZZTIME (default 1m; about
# 6 minutes in all); a failing input is written under the package's testdata/fuzz
# and replayed by `make test` from then on. No cluster needed.
FUZZTIME ?= 1m
FUZZ_TARGETS := FuzzLoad:./luabind/internal/sandbox FuzzPatterns:./luabind/internal/sandbox \
	FuzzCall:./luabind FuzzDecode:./luabind FuzzRoundTrip:./luabind/internal/luavalue
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "[fuzz] $${t%%:*} ($${t#*:}, $(FUZZTIME))"; \
		LUAOP_TEST_NO_CLUSTER=1 go test -run XXX -fuzz "^$${t%%:*}\$$" -fuzztime $(FUZZTIME) "$${t#*:}" 2>&1 | grep -v '^{' | grep -v '^20[0-9][0-9]/' | tail -n 3; \
		test $${PIPESTATUS[0]} -eq 0; \
	done

cluster:
	@localcluster/deps.sh && localcluster/up.sh

cluster-down:
	@localcluster/down.sh

# A cluster with a node that runs pods (deploy/ on it: deploy/README.md), in its own
# state folder; `make node-down` removes all it made.
NODE_CLUSTER_DIR ?= $(CACHE)/cluster-node
node:
	@LUAOP_CLUSTER_DIR=$(NODE_CLUSTER_DIR) localcluster/node-up.sh

node-down:
	@LUAOP_CLUSTER_DIR=$(NODE_CLUSTER_DIR) localcluster/node-down.sh

# luaop measured against a bare client-go controller (bench/bare), side by side, on a
# dedicated local control plane in its own state folder (never the one of `make test`).
# BENCH_FLAGS='-n 200' for a quick run, '-n 1000,10000' for both sizes; see BENCHMARKS.md.
BENCH_FLAGS ?=
bench:
	LUAOP_TEST_CLUSTER_DIR=$(CACHE)/cluster-bench localcluster/with-cluster.sh go run ./bench $(BENCH_FLAGS)

# Sharding across replicas (issue 36): luaop run --shard-across-replicas with 1, 2 and
# 3 replicas (and one unsharded) on the same API server: 10,000 objects created, their
# throughput, latency, assignment latency and each replica's RSS; then 600 objects
# whose handler waits in luaop.sleep(0.2), 4 workers per replica. About 15 minutes.
# BENCH_SHARDING_FLAGS='-n 3000 -slow-n 300' for a shorter run; see BENCHMARKS.md.
BENCH_SHARDING_FLAGS ?=
bench-sharding:
	LUAOP_TEST_CLUSTER_DIR=$(CACHE)/cluster-bench localcluster/with-cluster.sh go run ./bench -scenario sharding -timeout 15m $(BENCH_SHARDING_FLAGS)

# 2,000 and 10,000 objects with a sleeping daemon each: memory per daemon (heap,
# goroutine stacks, RSS) and idle CPU. BENCH_DAEMONS=2000 for one size (about 2 minutes).
BENCH_DAEMONS ?= 2000,10000
bench-daemons:
	LUAOP_BENCH_DAEMONS=$(BENCH_DAEMONS) LUAOP_TEST_CLUSTER_DIR=$(CACHE)/cluster-bench localcluster/with-cluster.sh go test -run XXX -bench IdleDaemons -benchtime 1x -timeout 40m ./e2e

# Reload latency (save -> new handler active) with 1, 50, 500 and 2,000 script files,
# then reload under load: 10,000 objects (LUAOP_BENCH_OBJECTS) created and updated
# while a script is saved every second. See BENCHMARKS.md, "Reload".
bench-reload:
	go test -run XXX -bench ReloadLatency -benchtime 100x ./reloading
	LUAOP_TEST_CLUSTER_DIR=$(CACHE)/cluster-bench localcluster/with-cluster.sh go test -run XXX -bench ReloadUnderLoad -benchtime 1x -timeout 40m ./e2e

# I/O-bound handlers: 200 objects whose create handler waits in luaop.sleep(1), luaop
# --workers=16: time until all are handled, and /healthz latency meanwhile (about 2
# minutes on today's main). BENCH_SLEEP_FLAGS='-n 400 -shards 4'; see BENCHMARKS.md.
BENCH_SLEEP_FLAGS ?=
bench-sleep:
	LUAOP_TEST_CLUSTER_DIR=$(CACHE)/cluster-bench localcluster/with-cluster.sh go run ./bench -scenario sleep $(BENCH_SLEEP_FLAGS)

# A soak, not part of `make test`: luaop run on 500 objects with a daemon each under
# steady churn (spec updates, delete + re-create, a script reload every 30 s) for
# SOAK_DURATION, on its own local control plane; checks at the end, exit 1 on failure.
SOAK_DURATION ?= 10m
SOAK_FLAGS ?=
soak:
	SOAK_DURATION=$(SOAK_DURATION) LUAOP_TEST_CLUSTER_DIR=$(CACHE)/cluster-soak localcluster/with-cluster.sh go run ./bench/soak $(SOAK_FLAGS)

# The chaos hour, not part of `make test`: 2,000 objects with create, update, field and
# delete handlers, a daemon and a timer each, under the soak's churn, with two luaop
# replicas under --leader-elect behind a proxy and faults at random intervals
# (kube-apiserver and etcd restarts, the leader killed, a 409 storm, a slow API, a watch
# answered 410; a script saved every 30 s); every handler run counted outside the
# operator. Checks at the end, exit 1 on failure; see RELIABILITY.md, "Chaos".
# CHAOS_DURATION=10m CHAOS_FLAGS='-objects 500' for a shorter run.
CHAOS_DURATION ?= 1h
CHAOS_FLAGS ?=
CHAOS_CLUSTER_DIR ?= $(CACHE)/cluster-chaos
chaos:
	SOAK_DURATION=$(CHAOS_DURATION) SOAK_SETTLE=5m LUAOP_TEST_CLUSTER_DIR=$(CHAOS_CLUSTER_DIR) localcluster/with-cluster.sh go run ./bench/soak -chaos -objects 2000 $(CHAOS_FLAGS)

# The fault-injection harness with every injection point (`make test` walks the first
# call of each kind in each step): a kill before and after, and a lost answer, at every
# call of its reference runs, on both storages. LUAOP_FAULTS_REPORT names a file that
# gets the summaries (RELIABILITY.md, "Fault injection").
faults:
	LUAOP_FAULTS=exhaustive localcluster/with-cluster.sh go test -count=1 -timeout 60m -run 'TestCrashBeforeAndAfterEveryCall|TestHiddenIntermediateStates|TestStaleReadsAfterRestart' ./e2e -v
