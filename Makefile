# luaop: the two commands of the README are `make dev` and `make test`.
SHELL := /bin/bash
CACHE ?= $(or $(LUAOP_CACHE),$(HOME)/.cache/luaop)
BIN := $(CURDIR)/bin
GO_TEST_FLAGS ?= -race -count=1 -timeout 40m

.PHONY: dev test unit cluster cluster-down build bench bench-daemons

build:
	go build -o $(BIN)/luaop ./cmd/luaop

# The developer loop: a local control plane (unless KUBECONFIG names a cluster), the
# example CRDs and one example object applied, and the example handlers running.
dev: build
	@set -euo pipefail; \
	localcluster/deps.sh; \
	if [ -z "$${KUBECONFIG:-}" ]; then export KUBECONFIG="$$(localcluster/up.sh)"; fi; \
	kubectl="$$(localcluster/build.sh)/kubectl"; \
	echo "[dev] cluster: $$KUBECONFIG"; \
	$$kubectl apply --server-side --force-conflicts -f scripts/examples/crds/ >/dev/null; \
	$$kubectl wait --for condition=established --timeout=30s -f scripts/examples/crds/ >/dev/null; \
	(sleep 3; $$kubectl apply --server-side -f scripts/examples/objects/ >/dev/null && echo "[dev] applied scripts/examples/objects/: watch the handlers react") & \
	exec $(BIN)/luaop dev scripts/examples

# The whole test suite against a dedicated local control plane, started and stopped here.
test:
	localcluster/with-cluster.sh go test $(GO_TEST_FLAGS) ./...

# Pure-logic tests only: no cluster needed.
unit:
	LUAOP_TEST_NO_CLUSTER=1 go test $(GO_TEST_FLAGS) ./...

cluster:
	@localcluster/deps.sh && localcluster/up.sh

cluster-down:
	@localcluster/down.sh

# luaop measured against a bare client-go controller (bench/bare), side by side, on a
# dedicated local control plane in its own state folder (never the one of `make test`).
# BENCH_FLAGS='-n 200' for a quick run, '-n 1000,10000' for both sizes; see BENCHMARKS.md.
BENCH_FLAGS ?=
bench:
	LUAOP_TEST_CLUSTER_DIR=$(CACHE)/cluster-bench localcluster/with-cluster.sh go run ./bench $(BENCH_FLAGS)

# 2,000 objects with a sleeping daemon each: memory per daemon and idle CPU.
bench-daemons:
	LUAOP_TEST_CLUSTER_DIR=$(CACHE)/cluster-bench localcluster/with-cluster.sh go test -run XXX -bench IdleDaemons -benchtime 1x -timeout 20m ./e2e
