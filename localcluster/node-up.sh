#!/usr/bin/env bash
# Starts a local Kubernetes cluster with a node that runs pods: the control plane of
# up.sh (listening on an address pods reach) and, like a kind node, a node in network
# and mount namespaces of its own: containerd 2 + runc, kubelet and kube-proxy inside,
# kube-scheduler beside the control plane. Prints the admin kubeconfig's path on
# stdout; progress on stderr. Idempotent. Stop everything with node-down.sh (same
# LUAOP_CLUSTER_DIR).
#
#   KUBECONFIG=$(LUAOP_CLUSTER_DIR=~/.cache/luaop/cluster-node localcluster/node-up.sh)
#
# Exit status 3: this machine cannot run a node (not root, no network namespaces, no
# memory cgroup); stdout then says which. Any other failure is an error.
#
# The topology (addresses from 198.19.0.0/16, a /24 per state folder, chosen from a
# hash of its path and recorded in node/node.env):
#
#   host: kube-apiserver on 198.19.N.1 ── veth lnd<hash> ──┐
#         etcd, kube-controller-manager,                    │
#         kube-scheduler (127.0.0.1)                        │
#   netns luaop-node-<hash>:          eth0 198.19.N.2/30 ───┘
#         containerd, kubelet, kube-proxy (iptables rules live here only)
#         bridge luaop0 198.19.N.129 ── pods 198.19.N.128/25
#   Services: 198.19.N.64/26 (`kubernetes` = 198.19.N.65 -> 198.19.N.1:<port>)
#
# The host routes the Services' and the pods' ranges to the node (so kube-apiserver
# calls webhook Services through kube-proxy, as on a kind node, and tests reach pods);
# the node has no default route: nothing a pod sends leaves the machine. The node's
# mount namespace is private: the kubelet's and containerd's mounts (rootfs overlays,
# volumes, pod network namespaces) never show on the host and vanish with it.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${LUAOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/luaop}"
STATE="${LUAOP_CLUSTER_DIR:-$CACHE_ROOT/cluster-node}"
NODE="$STATE/node"
NODE_NAME=luaop-node

log() { printf '[localcluster node] %s\n' "$*" >&2; }
# Once the node's description is written, what a failure leaves running is stopped by
# node-down.sh (the next node-up.sh runs it first).
die() {
  log "error: $*"
  [ -f "$NODE/node.env" ] && log "what was started keeps running: stop it with LUAOP_CLUSTER_DIR=$STATE $here/node-down.sh"
  exit 1
}
# Exit 3 with the reason on stdout (with-node.sh passes it on to the node suite).
cannot() { log "cannot start a node on this machine: $*"; echo "$*"; exit 3; }

# What a node needs of the machine; without it, say why and let the caller skip.
[ "$(uname -s)" = Linux ] || cannot "it needs Linux (network namespaces, cgroups)"
[ "$(id -u)" = 0 ] || cannot "it needs root (network namespaces, mounts, cgroups); run the node suite as root"
[ -d /sys/fs/cgroup/memory ] || [ -f /sys/fs/cgroup/cgroup.controllers ] || cannot "no memory cgroup under /sys/fs/cgroup"
if ! err=$(unshare --net --mount true 2>&1); then cannot "network and mount namespaces are not available: $err"; fi

kubectl_() { "$CP_BIN/kubectl" --kubeconfig "$STATE/admin.kubeconfig" "$@"; }

pid_runs() { # pid_runs <name>: the recorded process still runs that binary
  local f="$NODE/$1.pid" pid
  [ -f "$f" ] && pid=$(cat "$f") && [ -r "/proc/$pid/exe" ] && [ "$(basename "$(readlink "/proc/$pid/exe")")" = "$2" ]
}

CP_BIN="$("$here/build.sh")"
if [ -f "$NODE/up" ] && pid_runs holder sleep && pid_runs containerd containerd && pid_runs kubelet kubelet &&
  pid_runs kube-proxy kube-proxy && pid_runs kube-scheduler kube-scheduler &&
  kubectl_ get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True; then
  log "already running (node $NODE_NAME)"
  echo "$STATE/admin.kubeconfig"
  exit 0
fi

# Anything left from an earlier run (crashed, half started) goes first.
"$here/node-down.sh" >/dev/null 2>&1 || true

"$here/node-deps.sh"
PAUSE_TAR="$("$here/node-build.sh" --pause)"
BIN="$(dirname "$PAUSE_TAR")"
mkdir -p "$NODE"
t0=$(date +%s)

# --- names and addresses, from the state folder (two clusters never collide) -------
hash=$(printf %s "$STATE" | sha256sum | cut -c1-8)
NETNS="luaop-node-$hash"
VETH="lnd$hash"
octet=$(( 0x${hash:0:4} % 254 + 1 ))
for _ in $(seq 1 254); do
  # a /24 that no other address or route of the machine uses
  if ! ip -4 -o addr show | grep -q " 198\.19\.$octet\." && ! ip -4 route show | grep -q "^198\.19\.$octet\."; then break; fi
  octet=$(( octet % 254 + 1 ))
done
HOST_IP="198.19.$octet.1"
NODE_IP="198.19.$octet.2"
SERVICE_CIDR="198.19.$octet.64/26"
POD_CIDR="198.19.$octet.128/25"
POD_GATEWAY="198.19.$octet.129"
CGROUP_ROOT="/luaop-node-$hash"
SOCK="$NODE/containerd.sock"

# Folders the node's own mount namespace covers with its own (shim sockets, the CNI
# cache, the kubelet's log links): created on the host only when missing, listed in
# node-mountpoints, and removed by the last node-down.sh.
covered=(/run/containerd /var/lib/cni /var/log/containers)
for d in "${covered[@]}"; do
  if [ ! -d "$d" ]; then mkdir -p "$d"; echo "$d" >> "$CACHE_ROOT/node-mountpoints"; fi
done

cat > "$NODE/node.env" <<ENV
NODE_NAME=$NODE_NAME
NODE_NETNS=$NETNS
NODE_VETH=$VETH
NODE_HOST_IP=$HOST_IP
NODE_IP=$NODE_IP
NODE_SERVICE_CIDR=$SERVICE_CIDR
NODE_POD_CIDR=$POD_CIDR
NODE_CGROUP_ROOT=$CGROUP_ROOT
NODE_CONTAINERD_SOCKET=$SOCK
NODE_BIN=$BIN
KUBECONFIG=$STATE/admin.kubeconfig
ENV
log "node $NODE_NAME: netns $NETNS, host $HOST_IP, node $NODE_IP, pods $POD_CIDR, services $SERVICE_CIDR"

# --- network --------------------------------------------------------------------------
ip netns add "$NETNS"
ip link add "$VETH" type veth peer name "eth0-$hash" netns "$NETNS"
ip addr add "$HOST_IP/30" dev "$VETH"
ip link set "$VETH" up
ip -n "$NETNS" link set lo up
ip -n "$NETNS" link set "eth0-$hash" name eth0
ip -n "$NETNS" addr add "$NODE_IP/30" dev eth0
ip -n "$NETNS" link set eth0 up
ip route add "$SERVICE_CIDR" via "$NODE_IP" dev "$VETH"
# The node's own connections to Services (kube-proxy rewrites them after routing):
# a route for the range, as a node's default route would give.
ip -n "$NETNS" route add "$SERVICE_CIDR" via "$HOST_IP" dev eth0
ip route add "$POD_CIDR" via "$NODE_IP" dev "$VETH"
in_netns() { nsenter --net="/run/netns/$NETNS" "$@"; }
in_netns sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward'
# Pods that reach a Service whose endpoint is a pod on the same bridge need the
# bridge's traffic to pass iptables (kube-proxy's DNAT); per network namespace.
if in_netns test -f /proc/sys/net/bridge/bridge-nf-call-iptables; then
  in_netns sh -c 'echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables'
fi

# --- the control plane, on the host end of the veth ------------------------------------
KUBECONFIG_OUT=$(LUAOP_CLUSTER_DIR="$STATE" LUAOP_APISERVER_ADDRESS="$HOST_IP" LUAOP_SERVICE_CIDR="$SERVICE_CIDR" \
  LUAOP_FOR_NODE=1 "$here/up.sh")
API_PORT=$(cat "$STATE/apiserver.port")

# --- identities: client certificates of the cluster's CA ----------------------------------
client_cert() { # client_cert <file> <subject>
  [ -f "$NODE/$1.crt" ] && return 0
  openssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$NODE/$1.key" -out "$NODE/$1.csr" 2>/dev/null
  printf 'extendedKeyUsage=clientAuth\n' > "$NODE/$1.ext"
  openssl x509 -req -in "$NODE/$1.csr" -CA "$STATE/ca.crt" -CAkey "$STATE/ca.key" -CAcreateserial -days 3650 \
    -extfile "$NODE/$1.ext" -out "$NODE/$1.crt" 2>/dev/null
}
kubeconfig() { # kubeconfig <file> (its certificate)
  cat > "$NODE/$1.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: luaop-local
  cluster:
    server: https://$HOST_IP:$API_PORT
    certificate-authority: $STATE/ca.crt
users:
- name: $1
  user:
    client-certificate: $NODE/$1.crt
    client-key: $NODE/$1.key
contexts:
- name: luaop-local
  context: {cluster: luaop-local, user: $1}
current-context: luaop-local
KC
}
# The Node authorizer and NodeRestriction know a kubelet by this name and group;
# kube-proxy and kube-scheduler by the users their default RBAC bindings name.
client_cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME"; kubeconfig kubelet
client_cert kube-proxy "/CN=system:kube-proxy"; kubeconfig kube-proxy
client_cert kube-scheduler "/CN=system:kube-scheduler"; kubeconfig kube-scheduler
if [ ! -f "$NODE/kubelet-serving.crt" ]; then
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$NODE_NAME" -keyout "$NODE/kubelet-serving.key" -out "$NODE/kubelet-serving.csr" 2>/dev/null
  printf 'subjectAltName=IP:%s,DNS:%s\nextendedKeyUsage=serverAuth\n' "$NODE_IP" "$NODE_NAME" > "$NODE/kubelet-serving.ext"
  openssl x509 -req -in "$NODE/kubelet-serving.csr" -CA "$STATE/ca.crt" -CAkey "$STATE/ca.key" -CAcreateserial -days 3650 \
    -extfile "$NODE/kubelet-serving.ext" -out "$NODE/kubelet-serving.crt" 2>/dev/null
fi

# --- the node's mount namespace ------------------------------------------------------------
# One process holds it (and sits in the node's network namespace); the others enter
# both with nsenter. Inside: the covered folders are the node's own, and the kernel
# tunables the kubelet insists on read as it wants them (the kubelet would otherwise
# write vm.overcommit_memory, kernel.panic and four others for the whole machine, as
# it does on a kind node; here the host's values stay).
mkdir -p "$NODE/fs" "$NODE/sysctl"
mounts=()
for d in "${covered[@]}"; do mkdir -p "$NODE/fs$d"; mounts+=("$NODE/fs$d" "$d"); done
declare -A kubelet_tunables=(
  [vm/overcommit_memory]=1 [vm/panic_on_oom]=0 [kernel/panic]=10 [kernel/panic_on_oops]=1
  [kernel/keys/root_maxkeys]=1000000 [kernel/keys/root_maxbytes]=25000000)
for k in "${!kubelet_tunables[@]}"; do
  f="/proc/sys/$k"
  [ -f "$f" ] && [ "$(cat "$f")" != "${kubelet_tunables[$k]}" ] || continue
  echo "${kubelet_tunables[$k]}" > "$NODE/sysctl/${k//\//.}"
  mounts+=("$NODE/sysctl/${k//\//.}" "$f")
done
printf '%s\n' "${mounts[@]}" > "$NODE/mounts"
setsid nsenter --net="/run/netns/$NETNS" unshare --mount --propagation private -- sh -c '
  set -e
  while read -r src && read -r dst; do mount --bind "$src" "$dst"; done < "$1"
  echo ready > "$2"
  exec sleep infinity' holder "$NODE/mounts" "$NODE/holder.ready" > "$NODE/holder.log" 2>&1 < /dev/null &
echo $! > "$NODE/holder.pid"
for _ in $(seq 1 50); do [ -f "$NODE/holder.ready" ] && break; sleep 0.1; done
[ -f "$NODE/holder.ready" ] || die "the node's namespaces did not come up: $(cat "$NODE/holder.log")"
HOLDER=$(cat "$NODE/holder.pid")

start_in_node() { # start_in_node <name> <cmd...>: in the node's namespaces, pid recorded
  local name=$1; shift
  PATH="$BIN:$PATH" setsid nsenter --target "$HOLDER" --mount --net -- "$@" > "$NODE/$name.log" 2>&1 < /dev/null &
  echo $! > "$NODE/$name.pid"
}
alive() { kill -0 "$(cat "$NODE/$1.pid")" 2>/dev/null || die "$1 exited: $(tail -5 "$NODE/$1.log")"; }

# --- containerd and the pause image ------------------------------------------------------------
mkdir -p "$NODE/cni" "$NODE/cni-ipam" "$NODE/containerd" "$NODE/pod-logs"
cat > "$NODE/cni/10-luaop.conflist" <<CNI
{
  "cniVersion": "1.0.0",
  "name": "luaop-$hash",
  "plugins": [{
    "type": "bridge", "bridge": "luaop0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
    "ipam": {"type": "host-local", "dataDir": "$NODE/cni-ipam",
             "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$POD_GATEWAY"}]],
             "routes": [{"dst": "0.0.0.0/0"}]}
  }]
}
CNI
cat > "$NODE/containerd.toml" <<TOML
version = 3
root = "$NODE/containerd/root"
state = "$NODE/containerd/state"
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$NODE/containerd/opt"
[plugins."io.containerd.nri.v1.nri"]
  disable = true
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "luaop.local/pause:latest"
[plugins."io.containerd.cri.v1.runtime"]
  # Without CAP_SYS_RESOURCE a sandbox cannot lower its OOM score: runc fails with
  # "can't get final child's PID from pipe: EOF" unless the score is kept.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_cdi = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$NODE/cni"
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "$BIN/runc"
        Root = "$NODE/runc"
        SystemdCgroup = false
TOML
start_in_node containerd "$BIN/containerd" --config "$NODE/containerd.toml" --log-level warn
ctr_() { "$BIN/ctr" --address "$SOCK" --namespace k8s.io "$@"; }
for _ in $(seq 1 100); do ctr_ version >/dev/null 2>&1 && break; alive containerd; sleep 0.1; done
ctr_ version >/dev/null 2>&1 || die "containerd does not answer on $SOCK; see $NODE/containerd.log"
ctr_ images import "$PAUSE_TAR" >/dev/null || die "importing the pause image failed"
log "containerd up; pause image imported"

# --- kubelet --------------------------------------------------------------------------------
# cgroup v1 (this machine class): failCgroupV1 false. The pods' cgroups live under
# a root of this node's own. Disk and image garbage collection thresholds are
# relaxed: the machine's disk is shared, and the images here cannot be pulled again.
mkdir -p "$NODE/kubelet"
: > "$NODE/resolv.conf"
for h in $(findmnt -rn -t cgroup,cgroup2 -o TARGET); do  # each hierarchy's root (v1: one per controller)
  mkdir -p "$h$CGROUP_ROOT"
done
cat > "$NODE/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
containerRuntimeEndpoint: unix://$SOCK
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $NODE/kubelet-serving.crt
tlsPrivateKeyFile: $NODE/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $STATE/ca.crt}
authorization:
  mode: Webhook
podLogsDir: $NODE/pod-logs
resolvConf: $NODE/resolv.conf
failSwapOn: false
oomScoreAdj: 0
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
rotateCertificates: false
serverTLSBootstrap: false
YAML
start_in_node kubelet "$BIN/kubelet" --config "$NODE/kubelet.yaml" --kubeconfig "$NODE/kubelet.kubeconfig" \
  --root-dir "$NODE/kubelet" --node-ip "$NODE_IP" --hostname-override "$NODE_NAME" --v=1

# --- kube-proxy, kube-scheduler ------------------------------------------------------------------
cat > "$NODE/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $NODE/kube-proxy.kubeconfig}
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $POD_CIDR
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
oomScoreAdj: 0
# 0: the machine-wide conntrack table size is left as it is.
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
YAML
start_in_node kube-proxy "$BIN/kube-proxy" --config "$NODE/kube-proxy.yaml"
setsid "$BIN/kube-scheduler" --kubeconfig "$NODE/kube-scheduler.kubeconfig" \
  --authentication-kubeconfig "$NODE/kube-scheduler.kubeconfig" --authorization-kubeconfig "$NODE/kube-scheduler.kubeconfig" \
  --leader-elect=false --secure-port=0 > "$NODE/kube-scheduler.log" 2>&1 < /dev/null &
echo $! > "$NODE/kube-scheduler.pid"

# --- ready: the node Ready, and the `kubernetes` Service answering inside the node --------
for _ in $(seq 1 120); do
  kubectl_ get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True && break
  alive kubelet; alive containerd
  sleep 0.5
done
kubectl_ get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True ||
  die "node $NODE_NAME did not become Ready in 60s; see $NODE/kubelet.log"
service_ip="198.19.$octet.65"  # the first address of SERVICE_CIDR
for _ in $(seq 1 60); do
  in_netns curl -fsS --max-time 2 --cacert "$STATE/ca.crt" -H "Authorization: Bearer $(cat "$STATE/token")" \
    "https://$service_ip/readyz" 2>/dev/null | grep -qx ok && break
  alive kube-proxy
  sleep 0.5
done
in_netns curl -fsS --max-time 2 --cacert "$STATE/ca.crt" -H "Authorization: Bearer $(cat "$STATE/token")" \
  "https://$service_ip/readyz" 2>/dev/null | grep -qx ok ||
  die "the kubernetes Service ($service_ip:443) does not reach kube-apiserver from the node; see $NODE/kube-proxy.log"
alive kube-scheduler
date +%s > "$NODE/up"
log "node $NODE_NAME Ready in $(( $(date +%s) - t0 ))s; pods reach kube-apiserver at https://$service_ip:443"
log "use it with: export KUBECONFIG=$KUBECONFIG_OUT; import images with: $BIN/ctr --address $SOCK -n k8s.io images import IMAGE.tar"
echo "$KUBECONFIG_OUT"
