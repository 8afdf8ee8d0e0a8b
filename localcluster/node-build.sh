#!/usr/bin/env bash
# Builds what a node of the local control plane runs, into a cache folder outside the
# work tree keyed by version, and does nothing when it is already there:
#   kubelet, kube-proxy, kube-scheduler  from k8s.io/kubernetes, the same version as the
#                                        control plane (build.sh), in a scratch module
#                                        (kube-module.sh)
#   containerd, containerd-shim-runc-v2, ctr   from github.com/containerd/containerd/v2
#   runc                                 from github.com/opencontainers/runc, with seccomp (cgo)
#   pause-<hash>.tar                     the pod sandbox image, an image archive of the
#                                        static program imagebuild/pause (no registry is
#                                        reachable here), built by cmd/luaop-image
# Prints the folder on stdout (with --pause: the pause image's archive in it); progress
# on stderr. Cold: about 6 minutes on 2 cores once build.sh has filled the module
# cache; warm: instant.
#
#   LUAOP_NO_BUILD=1   fail (with what to run) instead of building
set -euo pipefail
print=folder
case "${1:-}" in
  --pause) print=pause ;;
  "") ;;
  *) echo "usage: localcluster/node-build.sh [--pause]" >&2; exit 2 ;;
esac
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=kube-module.sh
. "$here/kube-module.sh"

KUBE_VERSION="${LUAOP_KUBE_VERSION:-v1.37.2}"
CONTAINERD_VERSION="${LUAOP_CONTAINERD_VERSION:-v2.2.9}"
RUNC_VERSION="${LUAOP_RUNC_VERSION:-v1.3.3}"
CACHE_ROOT="${LUAOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/luaop}"
BIN_DIR="$CACHE_ROOT/bin/node-kube-$KUBE_VERSION-containerd-$CONTAINERD_VERSION-runc-$RUNC_VERSION"
work="$CACHE_ROOT/build"

log() { printf '[localcluster node build] %s\n' "$*" >&2; }

# The pause image changes with its source, not with a version: keyed by the hash of
# the code that builds it (not its tests). Archives of other hashes stay: another
# checkout of the project on this machine (a worktree) may be using one.
pause_hash=$(cat "$here/../imagebuild/pause/main.go" $(ls "$here/../imagebuild/"*.go "$here/../cmd/luaop-image/"*.go | grep -v '_test\.go$') |
  sha256sum | cut -c1-12)
PAUSE="pause-$pause_hash.tar"
done_() { if [ "$print" = pause ]; then echo "$BIN_DIR/$PAUSE"; else echo "$BIN_DIR"; fi; }

want=(kubelet kube-proxy kube-scheduler containerd containerd-shim-runc-v2 ctr runc "$PAUSE")
missing=()
for b in "${want[@]}"; do [ -s "$BIN_DIR/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then
  done_
  exit 0
fi
if [ "${LUAOP_NO_BUILD:-}" = 1 ]; then
  log "not built yet: ${missing[*]}; run localcluster/node-build.sh (about 6 minutes, once)"
  exit 1
fi
"$here/node-deps.sh"

export GOTOOLCHAIN=local GOFLAGS=-mod=mod
mkdir -p "$BIN_DIR" "$work"
start=$(date +%s)

need() { [ ! -s "$BIN_DIR/$1" ]; }

build_kube_node() {
  local d="$work/kube-node-$KUBE_VERSION" ld
  rm -rf "$d"; mkdir -p "$d"; cd "$d"
  kube_module "$d" "$KUBE_VERSION"
  local pkgs=(k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kube-scheduler)
  log "kubernetes $KUBE_VERSION: resolving modules (cold: ~2 min, warm after build.sh)"
  go get "${pkgs[@]}" >/dev/null 2>&1 || go get "${pkgs[@]}"
  ld=$(kube_ldflags "$KUBE_VERSION")
  for p in "${pkgs[@]}"; do
    local name="${p##*/}"
    need "$name" || continue
    log "kubernetes $KUBE_VERSION: compiling $name"
    go build -trimpath -ldflags "$ld" -o "$BIN_DIR/$name.tmp" "$p"
    mv "$BIN_DIR/$name.tmp" "$BIN_DIR/$name"
  done
}

# containerd 2 (kubelet 1.37 refuses Debian's containerd 1.6). Its snapshotters that
# need C libraries or kernel parts this machine lacks are left out by build tags.
build_containerd() {
  local d="$work/containerd-$CONTAINERD_VERSION" m=github.com/containerd/containerd/v2
  rm -rf "$d"; mkdir -p "$d"; cd "$d"
  go mod init luaop.local/containerdbuild >/dev/null 2>&1
  log "containerd $CONTAINERD_VERSION: resolving modules"
  go get "$m@$CONTAINERD_VERSION" >/dev/null 2>&1 || go get "$m@$CONTAINERD_VERSION"
  local ld="-s -w -X $m/version.Version=$CONTAINERD_VERSION -X $m/version.Package=$m"
  for c in containerd containerd-shim-runc-v2 ctr; do
    need "$c" || continue
    log "containerd $CONTAINERD_VERSION: compiling $c"
    # The shim is started for every pod: static, as upstream ships it.
    CGO_ENABLED=0 go build -trimpath -tags "no_btrfs no_devmapper no_zfs no_aufs" -ldflags "$ld" \
      -o "$BIN_DIR/$c.tmp" "$m/cmd/$c"
    mv "$BIN_DIR/$c.tmp" "$BIN_DIR/$c"
  done
}

# runc (Debian's crun 1.8 speaks an OCI spec older than containerd 2.2's), with the
# seccomp profiles of RuntimeDefault: cgo and libseccomp.
build_runc() {
  local d="$work/runc-$RUNC_VERSION" m=github.com/opencontainers/runc
  rm -rf "$d"; mkdir -p "$d"; cd "$d"
  go mod init luaop.local/runcbuild >/dev/null 2>&1
  log "runc $RUNC_VERSION: resolving modules"
  go get "$m@$RUNC_VERSION" >/dev/null 2>&1 || go get "$m@$RUNC_VERSION"
  log "runc $RUNC_VERSION: compiling (cgo, seccomp)"
  CGO_ENABLED=1 go build -trimpath -tags seccomp -ldflags "-s -w -X main.version=${RUNC_VERSION#v}" \
    -o "$BIN_DIR/runc.tmp" "$m"
  mv "$BIN_DIR/runc.tmp" "$BIN_DIR/runc"
}

build_pause() {
  log "pause image: building $PAUSE"
  # A temporary name of this process's own: two checkouts may build it at once.
  (cd "$here/.." && GOFLAGS= go run ./cmd/luaop-image pause -o "$BIN_DIR/$PAUSE.$$.tmp")
  mv "$BIN_DIR/$PAUSE.$$.tmp" "$BIN_DIR/$PAUSE"
}

if need kubelet || need kube-proxy || need kube-scheduler; then build_kube_node; fi
if need containerd || need containerd-shim-runc-v2 || need ctr; then build_containerd; fi
if need runc; then build_runc; fi
if need "$PAUSE"; then build_pause; fi
log "done in $(( $(date +%s) - start ))s: $BIN_DIR"
done_
