#!/usr/bin/env bash
# Stops what node-up.sh started and removes everything it made, in reverse order: the
# pods' processes (every process in the node's cgroups), kube-scheduler, kube-proxy,
# the kubelet, the containerd shims and containerd, the node's mount namespace (its
# mounts go with it), its network namespace (its bridge, veth and iptables rules go
# with it), the host's routes to it, the cgroups, the node's folder, and the control
# plane (down.sh). Only recorded processes are stopped, each only while its PID still
# runs the binary it started. Exits non-zero, naming it, when something is left.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${LUAOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/luaop}"
STATE="${LUAOP_CLUSTER_DIR:-$CACHE_ROOT/cluster-node}"
NODE="$STATE/node"
log() { printf '[localcluster node] %s\n' "$*" >&2; }

if [ ! -f "$NODE/node.env" ]; then
  LUAOP_CLUSTER_DIR="$STATE" "$here/down.sh"
  exit 0
fi
# shellcheck disable=SC1091
. "$NODE/node.env"
case "${NODE_CGROUP_ROOT:-}" in
  /luaop-node-?*) ;;
  *) log "error: $NODE/node.env names no cgroup root of a node (\"${NODE_CGROUP_ROOT:-}\"); remove the node by hand"; exit 1 ;;
esac

# running <pid>: alive and not a zombie waiting for whoever adopted it to reap it.
running() { local st; st=$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) && [ "$st" != Z ]; }

stop() { # stop <name> <binary>
  local pidfile="$NODE/$1.pid" pid
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if [ -r "/proc/$pid/exe" ] && [ "$(basename "$(readlink "/proc/$pid/exe")")" = "$2" ]; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 50); do running "$pid" || break; sleep 0.1; done
    running "$pid" && kill -KILL "$pid" 2>/dev/null
    log "stopped $1 (pid $pid)"
  fi
  rm -f "$pidfile"
}

# The kubelet first, so that it restarts nothing; then every process of the pods.
stop kubelet kubelet
# Each cgroup hierarchy's root (v1: one per controller; v2: one), as node-up.sh made them.
hierarchies() { findmnt -rn -t cgroup,cgroup2 -o TARGET; }
# A loop, not one cat of a glob: with nothing matching, cat would read standard input.
pod_pids() {
  local h f
  for h in $(hierarchies); do
    for f in "$h$NODE_CGROUP_ROOT"/**/cgroup.procs; do cat "$f" 2>/dev/null; done
  done
}
shopt -s globstar nullglob
for _ in 1 2 3; do
  pids=$(pod_pids | sort -u)
  [ -z "$pids" ] && break
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null
  sleep 0.2
done
stop kube-scheduler kube-scheduler
stop kube-proxy kube-proxy
# The shims of this containerd: by the address they were started with.
for p in /proc/[0-9]*; do
  [ "$(basename "$(readlink "$p/exe" 2>/dev/null)")" = containerd-shim-runc-v2 ] || continue
  tr '\0' ' ' < "$p/cmdline" 2>/dev/null | grep -qF -- "-address $NODE_CONTAINERD_SOCKET " && kill -KILL "${p#/proc/}" 2>/dev/null
done
stop containerd containerd
stop holder sleep

# The network namespace holds the node's end of the veth, the bridge, the pods'
# interfaces and kube-proxy's rules: deleting it removes them all, and the host's end
# of the veth with its routes.
if ip netns list | grep -qw "$NODE_NETNS"; then
  ip netns del "$NODE_NETNS" && log "deleted network namespace $NODE_NETNS"
fi
ip link show "$NODE_VETH" >/dev/null 2>&1 && ip link del "$NODE_VETH" 2>/dev/null

# The cgroups: deepest first (a cgroup goes only once its children and processes have).
for h in $(hierarchies); do
  d="$h$NODE_CGROUP_ROOT"
  [ -d "$d" ] || continue
  for _ in 1 2 3 4 5; do
    find "$d" -depth -type d -exec rmdir {} + 2>/dev/null
    [ -d "$d" ] || break
    sleep 0.2
  done
done

rm -rf "$NODE"
# The folders a node-up.sh made as mount points (listed in $CACHE_ROOT/node-mountpoints):
# by the last node to go (an rmdir would detach another node's mounts there).
if ! ip netns list | grep -q '^luaop-node-' && [ -f "$CACHE_ROOT/node-mountpoints" ]; then
  while read -r d; do rmdir "$d" 2>/dev/null; done < "$CACHE_ROOT/node-mountpoints"
  rm -f "$CACHE_ROOT/node-mountpoints"
fi
LUAOP_CLUSTER_DIR="$STATE" "$here/down.sh"

# What would be left, named.
left=()
ip netns list | grep -qw "$NODE_NETNS" && left+=("network namespace $NODE_NETNS")
ip link show "$NODE_VETH" >/dev/null 2>&1 && left+=("interface $NODE_VETH")
ip -4 route show | grep -qF "${NODE_POD_CIDR}" && left+=("route to $NODE_POD_CIDR")
for h in $(hierarchies); do [ -d "$h$NODE_CGROUP_ROOT" ] && left+=("cgroup $h$NODE_CGROUP_ROOT"); done
[ -n "$(pod_pids)" ] && left+=("processes $(pod_pids | tr '\n' ' ')")
grep -qF "$NODE" /proc/self/mountinfo && left+=("mounts under $NODE")
if [ ${#left[@]} -gt 0 ]; then
  log "error: left behind: ${left[*]}"
  exit 1
fi
log "node $NODE_NAME removed"
