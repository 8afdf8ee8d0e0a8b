#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager and kubectl from the Go module
# proxy into a cache folder outside the work tree, keyed by version, and does nothing
# when they are already there. Cold: about 10 minutes on 2 cores; warm: instant.
#
# Why a scratch module: etcd's and kubernetes' own go.mod files carry replace
# directives (./staging/...), so `go install pkg@version` refuses them. A scratch module
# that requires them and replaces every staging module with its published version
# builds (kube-module.sh; node-build.sh builds the node's commands the same way).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=kube-module.sh
. "$here/kube-module.sh"

ETCD_VERSION="${LUAOP_ETCD_VERSION:-v3.7.3}"
KUBE_VERSION="${LUAOP_KUBE_VERSION:-v1.37.2}"
CACHE_ROOT="${LUAOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/luaop}"
BIN_DIR="$CACHE_ROOT/bin/etcd-$ETCD_VERSION-kube-$KUBE_VERSION"

if [ "${LUAOP_NO_BUILD:-}" = 1 ]; then
  for b in etcd kube-apiserver kube-controller-manager kubectl; do
    [ -x "$BIN_DIR/$b" ] || { echo "[localcluster build] $b is not built yet; run localcluster/build.sh (about 10 minutes, once)" >&2; exit 1; }
  done
fi

export GOTOOLCHAIN=local GOFLAGS=-mod=mod

log() { printf '[localcluster build] %s\n' "$*" >&2; }

want=(etcd kube-apiserver kube-controller-manager kubectl)
missing=()
for b in "${want[@]}"; do [ -x "$BIN_DIR/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then
  echo "$BIN_DIR"
  exit 0
fi

mkdir -p "$BIN_DIR"
work="$CACHE_ROOT/build"
mkdir -p "$work"

build_etcd() {
  local d="$work/etcd-$ETCD_VERSION"
  rm -rf "$d"; mkdir -p "$d"; cd "$d"
  log "etcd $ETCD_VERSION: resolving modules (cold: ~2 min)"
  go mod init luaop.local/etcdbuild >/dev/null 2>&1
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null 2>&1
  log "etcd $ETCD_VERSION: compiling"
  go build -trimpath -ldflags "-s -w" -o "$BIN_DIR/etcd.tmp" go.etcd.io/etcd/server/v3
  mv "$BIN_DIR/etcd.tmp" "$BIN_DIR/etcd"
}

build_kube() {
  local d="$work/kube-$KUBE_VERSION"
  rm -rf "$d"; mkdir -p "$d"; cd "$d"
  log "kubernetes $KUBE_VERSION: reading its go.mod"
  kube_module "$d" "$KUBE_VERSION"
  local pkgs=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl)
  log "kubernetes $KUBE_VERSION: resolving modules (cold: ~2 min)"
  go get "${pkgs[@]}" >/dev/null 2>&1 || go get "${pkgs[@]}"
  local ld
  ld=$(kube_ldflags "$KUBE_VERSION")
  for p in "${pkgs[@]}"; do
    local name="${p##*/}"
    [ -x "$BIN_DIR/$name" ] && continue
    log "kubernetes $KUBE_VERSION: compiling $name (cold: several minutes)"
    go build -trimpath -ldflags "$ld" -o "$BIN_DIR/$name.tmp" "$p"
    mv "$BIN_DIR/$name.tmp" "$BIN_DIR/$name"
  done
}

start=$(date +%s)
[ -x "$BIN_DIR/etcd" ] || build_etcd
build_kube
log "done in $(( $(date +%s) - start ))s: $BIN_DIR"
echo "$BIN_DIR"
