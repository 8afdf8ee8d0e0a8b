#!/usr/bin/env bash
# Stops the local control plane started by up.sh: exactly the processes it recorded,
# and only while each PID still runs the binary it started (PIDs are reused).
set -uo pipefail
CACHE_ROOT="${LUAOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/luaop}"
STATE="${LUAOP_CLUSTER_DIR:-$CACHE_ROOT/cluster}"
log() { printf '[localcluster] %s\n' "$*" >&2; }

stop() { # stop <name>
  local name=$1 pidfile="$STATE/$1.pid" pid
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if [ -r "/proc/$pid/exe" ] && [ "$(basename "$(readlink "/proc/$pid/exe")")" = "$name" ]; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    log "stopped $name (pid $pid)"
  fi
  rm -f "$pidfile"
}

# Reverse order of start: clients of the API first, etcd last.
stop kube-controller-manager
stop kube-apiserver
stop luaop-forwarder
stop etcd
rm -f "$STATE/apiserver.port"

# The kind-like topology (LUAOP_CLUSTER_TOPOLOGY=netns): exactly the namespace and
# the veth its up.sh recorded (deleting the namespace deletes the veth's other end).
if [ -f "$STATE/netns.env" ]; then
  NETNS="" VETH=""
  # shellcheck disable=SC1091
  . "$STATE/netns.env"
  if [ -n "$NETNS" ] && ip netns list 2>/dev/null | grep -qw "^$NETNS"; then
    ip netns del "$NETNS" && log "removed network namespace $NETNS"
  fi
  if [ -n "$VETH" ] && ip link show "$VETH" >/dev/null 2>&1; then
    ip link del "$VETH" && log "removed $VETH"
  fi
  rm -f "$STATE/netns.env"
fi
rm -f "$STATE/topology"
