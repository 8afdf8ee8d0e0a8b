# luaop: the two commands of the README are `make dev` and `make test`.
SHELL := /bin/bash
CACHE ?= $(or $(LUAOP_CACHE),$(HOME)/.cache/luaop)
BIN := $(CURDIR)/bin
GO_TEST_FLAGS ?= -race -count=1 -timeout 40m

.PHONY: dev test unit cluster cluster-down build stubs bench

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
	$$kubectl apply -f scripts/examples/crds/; \
	$$kubectl wait --for condition=established --timeout=30s -f scripts/examples/crds/ >/dev/null; \
	(sleep 3; $$kubectl apply -f scripts/examples/objects/ >/dev/null && echo "[dev] applied scripts/examples/objects/: watch the handlers react") & \
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
