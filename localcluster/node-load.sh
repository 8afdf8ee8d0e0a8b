#!/usr/bin/env bash
# Imports image archives into the containerd of the node of node-up.sh (what `kind
# load image-archive` does for kind): pods then run them with imagePullPolicy
# IfNotPresent or Never, as no registry is reachable.
#
#   make image-archive && localcluster/node-load.sh bin/luaop-image.tar
set -euo pipefail
CACHE_ROOT="${LUAOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/luaop}"
STATE="${LUAOP_CLUSTER_DIR:-$CACHE_ROOT/cluster-node}"
env_file="$STATE/node/node.env"
[ $# -gt 0 ] || { echo "usage: localcluster/node-load.sh IMAGE.tar..." >&2; exit 2; }
[ -f "$env_file" ] || { echo "[localcluster node] no node in $STATE: start one with localcluster/node-up.sh (make node)" >&2; exit 1; }
# shellcheck disable=SC1090
. "$env_file"
for archive in "$@"; do
  "$NODE_BIN/ctr" --address "$NODE_CONTAINERD_SOCKET" --namespace k8s.io images import "$archive" >&2
  echo "[localcluster node] imported $archive into $NODE_NAME" >&2
done
