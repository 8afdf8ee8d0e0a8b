#!/usr/bin/env bash
# Runs a command with a cluster that has a node (node-up.sh) up, then removes it
# (node-down.sh), whatever the command's outcome. The command sees
# LUAOP_TEST_NODE_KUBECONFIG and LUAOP_TEST_NODE_DIR (the state folder; node/node.env
# there tells the node's names and addresses). Where this machine cannot run a node
# (node-up.sh exits 3: not root, no network namespaces, no memory cgroup), the command
# runs all the same with LUAOP_TEST_NODE_SKIP set to the reason, and the node suite
# skips itself saying so; any other failure to start the node fails.
#
# The cluster is a second one, in its own state folder (LUAOP_TEST_NODE_CLUSTER_DIR,
# default: the test cluster's folder with -node appended): the deployed operator's
# cluster-wide webhooks and ClusterRoles never meet the other suites' objects.
#
#   localcluster/with-cluster.sh localcluster/with-node.sh go test ./...   (make test)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${LUAOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/luaop}"
dir="${LUAOP_TEST_NODE_CLUSTER_DIR:-${LUAOP_TEST_CLUSTER_DIR:-$CACHE_ROOT/cluster-test}-node}"

if [ "${LUAOP_TEST_NO_CLUSTER:-}" = 1 ]; then exec "$@"; fi
set +e
out=$(LUAOP_CLUSTER_DIR="$dir" "$here/node-up.sh")
status=$?
set -e
if [ $status = 3 ]; then
  export LUAOP_TEST_NODE_SKIP="$out"
  echo "[localcluster node] the node suite will skip: $LUAOP_TEST_NODE_SKIP" >&2
  exec "$@"
fi
trap 'LUAOP_CLUSTER_DIR="$dir" "$here/node-down.sh"' EXIT
if [ $status != 0 ]; then
  # node-down.sh removes the logs: their ends go to the output first.
  for f in "$dir"/node/*.log "$dir"/*.log; do
    [ -s "$f" ] && { echo "--- $f" >&2; tail -15 "$f" >&2; }
  done
  echo "[localcluster node] error: the node did not start (exit $status)" >&2
  exit $status
fi
export LUAOP_TEST_NODE_KUBECONFIG="$out" LUAOP_TEST_NODE_DIR="$dir"
"$@"
