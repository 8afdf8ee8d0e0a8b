#!/usr/bin/env bash
# Runs a command with a dedicated local control plane up, then stops it, whatever the
# command's outcome. The command sees LUAOP_TEST_KUBECONFIG (and KUBECONFIG).
# The cluster lives in its own state folder, so it never disturbs `make dev`.
#
#   localcluster/with-cluster.sh go test ./...
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${LUAOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/luaop}"
export LUAOP_CLUSTER_DIR="${LUAOP_TEST_CLUSTER_DIR:-$CACHE_ROOT/cluster-test}"

"$here/deps.sh"
"$here/build.sh" >/dev/null
trap '"$here/down.sh"' EXIT
kubeconfig="$("$here/up.sh")"
export LUAOP_TEST_KUBECONFIG="$kubeconfig" KUBECONFIG="$kubeconfig"
"$@"
