#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager and kubectl from the Go module
# proxy into a cache folder outside the work tree, keyed by version, and does nothing
# when they are already there. Cold: about 10 minutes on 2 cores; warm: instant.
#
# Why a scratch module: etcd's and kubernetes' own go.mod files carry replace
# directives (./staging/...), so `go install pkg@version` refuses them. A scratch module
# that requires them and replaces every staging module with its published version builds.
set -euo pipefail

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
  local minor="${KUBE_VERSION#v1.}"; minor="${minor%%.*}"
  local stag="v0.${KUBE_VERSION#v1.}"
  rm -rf "$d"; mkdir -p "$d"; cd "$d"
  log "kubernetes $KUBE_VERSION: reading its go.mod"
  local modfile
  modfile=$(go mod download -json "k8s.io/kubernetes@$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  local goline
  goline=$(grep -m1 '^go ' "$modfile")
  {
    echo "module luaop.local/kubebuild"
    echo
    echo "$goline"
    echo
    echo "require k8s.io/kubernetes $KUBE_VERSION"
    echo
    # every staging module kubernetes replaces with ./staging/src/k8s.io/<name>
    grep -E '^\s*k8s.io/[a-z0-9-]+ => \./staging/' "$modfile" | awk '{print $1}' \
      | grep -v -E 'k8s.io/(sample-cli-plugin|sample-controller)$' \
      | while read -r m; do echo "replace $m => $m $stag"; done
  } > go.mod
  local pkgs=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kubectl)
  log "kubernetes $KUBE_VERSION: resolving modules (cold: ~2 min)"
  go get "${pkgs[@]}" >/dev/null 2>&1 || go get "${pkgs[@]}"
  local ld="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  done
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
