#!/usr/bin/env bash
# Starts a local Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager)
# on loopback and prints the path of its admin kubeconfig on stdout. Idempotent: when the
# cluster recorded in the state folder is already up, it only prints the path again.
# Progress goes to stderr. Stop it with localcluster/down.sh.
#
#   KUBECONFIG=$(localcluster/up.sh)
#   LUAOP_APISERVER_FLAGS='--feature-gates=CBORServingAndStorage=true' localcluster/up.sh
#                                     # extra kube-apiserver flags (split on spaces)
#   LUAOP_CLUSTER_TOPOLOGY=netns localcluster/up.sh
#                                     # kind-like: the control plane in a network namespace
#                                     # of its own (root), see below
#
# Topologies (LUAOP_CLUSTER_TOPOLOGY):
#   host (the default): etcd, kube-apiserver and kube-controller-manager on this
#     machine's loopback.
#   netns: laid out as kind lays a cluster out. The control plane runs in a network
#     namespace of its own ("luaop-<hash of the state folder>"), attached to this
#     machine by a veth pair only ("lvh<hash>" here, eth0 there) on a /24 of
#     198.18.0.0/16 (the benchmark range: nothing leaves the machine; this machine is
#     .1, the namespace .2 and its default gateway is .1, as a kind node reaches the
#     host only through its bridge's gateway). kube-apiserver listens on :6443 there
#     and is published on this machine's 127.0.0.1:<port> by luaop-forwarder
#     (localcluster/forwarder, built here), as docker publishes kind's port. A Node
#     object "luaop-control-plane" carries the namespace's address as its InternalIP,
#     as kind's control-plane node does (no kubelet runs). The serving certificate
#     holds that address too. down.sh removes the namespace, the veth and the
#     forwarder. Needs root and iproute2; exits with status 3 when a network
#     namespace cannot be made (tests skip on it, saying why).
#
# A control plane for a node (localcluster/node-up.sh sets these; see there; host
# topology only):
#   LUAOP_APISERVER_ADDRESS  the address kube-apiserver listens on and advertises
#                            (default 127.0.0.1); not loopback: the `kubernetes`
#                            Service gets it as its endpoint, so pods reach the server
#   LUAOP_SERVICE_CIDR       the Services' range (default 10.0.0.0/24)
#   LUAOP_FOR_NODE=1         what pods need: ServiceAccount admission (their token),
#                            the Node authorizer and NodeRestriction, a client
#                            certificate for reaching kubelets, and the controllers of
#                            Deployments, ReplicaSets, EndpointSlices, PodDisruption-
#                            Budgets and the kube-root-ca.crt ConfigMaps
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE_ROOT="${LUAOP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/luaop}"
STATE="${LUAOP_CLUSTER_DIR:-$CACHE_ROOT/cluster}"
KUBECONFIG_OUT="$STATE/admin.kubeconfig"

log() { printf '[localcluster] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# etcd reads every ETCD_* variable as a flag: drop whatever the caller exported.
while IFS='=' read -r name _; do
  case "$name" in ETCD_*) unset "$name" ;; esac
done < <(env)

TOPOLOGY="${LUAOP_CLUSTER_TOPOLOGY:-host}"
ADDR="${LUAOP_APISERVER_ADDRESS:-127.0.0.1}"
SERVICE_CIDR="${LUAOP_SERVICE_CIDR:-10.0.0.0/24}"
FOR_NODE="${LUAOP_FOR_NODE:-}"
case "$TOPOLOGY" in
  host | netns) ;;
  *) die "LUAOP_CLUSTER_TOPOLOGY=$TOPOLOGY: use host (the default) or netns (kind-like)" ;;
esac
[ "$TOPOLOGY" = host ] || [ "$ADDR" = 127.0.0.1 ] ||
  die "LUAOP_APISERVER_ADDRESS is for the host topology (netns publishes the API server on 127.0.0.1)"

ready() { # ready <port>: /readyz answers ok
  [ -f "$STATE/ca.crt" ] && [ -f "$STATE/token" ] || return 1
  curl -fsS --max-time 2 --cacert "$STATE/ca.crt" -H "Authorization: Bearer $(cat "$STATE/token")" \
    "https://$ADDR:$1/readyz" 2>/dev/null | grep -qx ok
}

if [ -f "$STATE/apiserver.port" ] && [ "$(cat "$STATE/topology" 2>/dev/null || echo host)" = "$TOPOLOGY" ] &&
  ready "$(cat "$STATE/apiserver.port")"; then
  log "already running at https://$ADDR:$(cat "$STATE/apiserver.port")"
  echo "$KUBECONFIG_OUT"
  exit 0
fi

command -v openssl >/dev/null || die "openssl is missing: apt-get install -y openssl"
command -v curl >/dev/null || die "curl is missing: apt-get install -y curl"

# Anything left from an earlier run (crashed, half started) goes first.
"$here/down.sh" >/dev/null 2>&1 || true

BIN="$("$here/build.sh")"
mkdir -p "$STATE"
rm -rf "$STATE/etcd-data" "$STATE"/*.log "$STATE"/*.pid
cd "$STATE"

# The kind-like topology: a network namespace, its veth, its addresses (see above).
# RUN prefixes the commands that run in the control plane's network; ETCD_HOST,
# API_BIND and API_ADVERTISE are where etcd and kube-apiserver are reached there.
RUN=() NODE_IP="" HOST_IP="" NETNS=""
if [ "$TOPOLOGY" = netns ]; then
  netns_fail() { log "error: cannot make the kind-like topology (LUAOP_CLUSTER_TOPOLOGY=netns): $*"; exit 3; }
  [ "$(id -u)" = 0 ] || netns_fail "it needs root (network namespaces, a veth pair)"
  command -v ip >/dev/null || netns_fail "ip is missing: apt-get install -y iproute2"
  command -v sha256sum >/dev/null || netns_fail "sha256sum is missing: apt-get install -y coreutils"
  h=$(printf '%s' "$STATE" | sha256sum | cut -c1-8)
  NETNS="luaop-$h" VETH="lvh$h" PEER="lvn$h"
  # A /24 of 198.18.0.0/16 picked from the hash, the next one free on this machine.
  first=$(( 16#${h:0:2} )) n=""
  for i in $(seq 0 255); do
    c=$(( (first + i) % 256 ))
    if ! ip -4 -o addr show | grep -q " 198\.18\.$c\."; then n=$c; break; fi
  done
  [ -n "$n" ] || netns_fail "no free /24 left in 198.18.0.0/16"
  HOST_IP="198.18.$n.1" NODE_IP="198.18.$n.2"
  ip netns add "$NETNS" 2>/dev/null || netns_fail "ip netns add $NETNS: $(ip netns add "$NETNS" 2>&1)"
  # Recorded at once: down.sh removes what was made even if the rest fails.
  printf 'NETNS=%s\nVETH=%s\nHOST_IP=%s\nNODE_IP=%s\n' "$NETNS" "$VETH" "$HOST_IP" "$NODE_IP" > netns.env
  ip link add "$VETH" type veth peer name "$PEER" netns "$NETNS" || netns_fail "a veth pair into $NETNS"
  ip addr add "$HOST_IP/24" dev "$VETH"
  ip link set "$VETH" up
  ip -n "$NETNS" link set "$PEER" name eth0
  ip -n "$NETNS" addr add "$NODE_IP/24" dev eth0
  ip -n "$NETNS" link set eth0 up
  ip -n "$NETNS" link set lo up
  ip -n "$NETNS" route add default via "$HOST_IP"
  RUN=(ip netns exec "$NETNS")
  log "network namespace $NETNS: $NODE_IP (eth0), gateway $HOST_IP ($VETH on this machine)"
  go build -C "$here/.." -o "$STATE/luaop-forwarder" ./localcluster/forwarder || die "building localcluster/forwarder"
fi
echo "$TOPOLOGY" > topology

port_free() { ! (exec 3<>"/dev/tcp/$ADDR/$1") 2>/dev/null && ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# Ports outside the kernel's ephemeral range: while a component is down (a test
# restarts it), a port inside that range can be taken by any outgoing connection on the
# machine, and the restarted etcd or kube-apiserver then fails with "address already in
# use". The larger free gap is used: from 15000 up to the range's low bound, or from its
# high bound up to 65535.
eph_low=32768 eph_high=60999
read -r eph_low eph_high 2>/dev/null < /proc/sys/net/ipv4/ip_local_port_range || true
port_lo=$(( 15000 )) port_span=$(( eph_low - 15000 - 2 ))
if [ $(( 65535 - eph_high - 2 )) -gt "$port_span" ]; then
  port_lo=$(( eph_high + 1 )) port_span=$(( 65535 - eph_high - 2 ))
fi
if [ "$port_span" -lt 2000 ]; then
  log "warning: the ephemeral port range ($eph_low-$eph_high) leaves no room for the cluster's ports; using 20000-60000, inside it: a restarted etcd or kube-apiserver may find its port taken"
  port_lo=20000 port_span=40000
fi
pick_port() {
  local p
  for _ in $(seq 1 50); do
    p=$(( port_lo + (RANDOM * 32768 + RANDOM) % port_span ))
    if port_free "$p" && port_free $((p + 1)); then echo "$p"; return; fi
  done
  die "no free loopback port found"
}

if [ ! -f ca.crt ] || [ ! -f ca.key ] || [ ! -f sa.key ]; then
  log "generating a CA and service-account keys"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=luaop-local-ca" \
    -keyout ca.key -out ca.crt 2>/dev/null
  openssl genrsa -out sa.key 2048 2>/dev/null
  openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > token
  printf '%s,admin,admin,system:masters\n' "$(cat token)" > tokens.csv
  # Certificates of the old CA would not be trusted any more.
  rm -f apiserver.crt kubelet-client.crt
fi
# The serving certificate holds the addresses the API server is reached at (the
# namespace's too in the netns topology, as kubeadm puts the node's there; the address
# it advertises for a node) and the first address of the Services' range: the
# `kubernetes` Service, which pods dial by IP (KUBERNETES_SERVICE_HOST).
service_ip() { local net=${1%/*} a b c d; IFS=. read -r a b c d <<< "$net"; echo "$a.$b.$c.$((d + 1))"; }
sans="IP:127.0.0.1,IP:$(service_ip "$SERVICE_CIDR"),DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc${NODE_IP:+,IP:$NODE_IP}"
[ "$ADDR" = 127.0.0.1 ] || sans="IP:$ADDR,$sans"
if [ ! -f apiserver.crt ] || [ "$(cat apiserver.sans 2>/dev/null)" != "$sans" ]; then
  log "generating the API server's serving certificate ($sans)"
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout apiserver.key -out apiserver.csr 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$sans" > apiserver.ext
  openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
    -extfile apiserver.ext -out apiserver.crt 2>/dev/null
  echo "$sans" > apiserver.sans
fi

# Loopback cannot be the `kubernetes` Service's endpoint ("cannot use public IP
# 127.0.0.1 with endpoint reconciler"): that Service then has none. Another address is
# kept as its endpoint by the server itself (the lease reconciler, the default). The
# netns topology advertises the namespace's address but runs no node: no endpoint.
server_flags=()
{ [ "$ADDR" = 127.0.0.1 ] || [ "$TOPOLOGY" = netns ]; } && server_flags+=(--endpoint-reconciler-type none)
controllers=garbagecollector,namespace,serviceaccount,serviceaccount-token
if [ "$FOR_NODE" = 1 ]; then
  if [ ! -f kubelet-client.crt ]; then
    # kube-apiserver's identity towards kubelets (logs, exec, port-forward).
    openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" \
      -keyout kubelet-client.key -out kubelet-client.csr 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' > kubelet-client.ext
    openssl x509 -req -in kubelet-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile kubelet-client.ext -out kubelet-client.crt 2>/dev/null
  fi
  # Kubelets are reached at their node IP (their names resolve nowhere).
  server_flags+=(--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction --kubelet-preferred-address-types InternalIP
    --kubelet-client-certificate "$STATE/kubelet-client.crt" --kubelet-client-key "$STATE/kubelet-client.key")
  controllers=$controllers,deployment,replicaset,endpointslice,endpointslicemirroring,disruption,root-ca-cert-publisher,podgc,nodelifecycle
else
  # No pods run: the ServiceAccount admission would refuse objects of namespaces
  # whose default ServiceAccount does not exist yet.
  server_flags+=(--authorization-mode RBAC --disable-admission-plugins ServiceAccount)
fi

start() { # start <name> <cmd...>: in its own session, pid recorded
  local name=$1; shift
  setsid "$@" >"$STATE/$name.log" 2>&1 < /dev/null &
  echo $! > "$STATE/$name.pid"
}
# start_cp starts a control-plane process: in the namespace with the netns topology
# (ip netns exec execs the binary: the pid recorded is the binary's).
start_cp() {
  local name=$1; shift
  start "$name" ${RUN[@]+"${RUN[@]}"} "$@"
}
incp() { ${RUN[@]+"${RUN[@]}"} "$@"; } # a command in the control plane's network

t0=$(date +%s)
for attempt in 1 2 3; do
  if [ "$TOPOLOGY" = netns ]; then etcd_port=2379; else etcd_port=$(pick_port); fi
  start_cp etcd "$BIN/etcd" --data-dir "$STATE/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$((etcd_port + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
    --initial-cluster "default=http://127.0.0.1:$((etcd_port + 1))" \
    --unsafe-no-fsync --logger zap --log-level warn --quota-backend-bytes 8589934592
  for _ in $(seq 1 100); do
    incp curl -fsS --max-time 1 "http://127.0.0.1:$etcd_port/health" 2>/dev/null | grep -q '"health":"true"' && break
    kill -0 "$(cat etcd.pid)" 2>/dev/null || break
    sleep 0.1
  done
  # A healthy answer may come from another etcd that took the port meanwhile (ours
  # then failed with "address already in use"): it must be ours, still running.
  if incp curl -fsS --max-time 1 "http://127.0.0.1:$etcd_port/health" 2>/dev/null | grep -q '"health":"true"' &&
    kill -0 "$(cat etcd.pid)" 2>/dev/null && ! grep -q "address already in use" etcd.log; then
    break
  fi
  log "etcd did not start on port $etcd_port (attempt $attempt): $(tail -2 etcd.log)"
  kill "$(cat etcd.pid)" 2>/dev/null || true
  [ "$attempt" = 3 ] && die "etcd failed to start; see $STATE/etcd.log"
done
log "etcd up on 127.0.0.1:$etcd_port"

read -r -a extra_apiserver_flags <<< "${LUAOP_APISERVER_FLAGS:-}"
api_bind=$ADDR api_advertise=$ADDR
[ "$TOPOLOGY" = netns ] && api_bind=0.0.0.0 api_advertise=$NODE_IP
for attempt in 1 2 3; do
  api_port=$(pick_port) secure_port=$api_port
  if [ "$TOPOLOGY" = netns ]; then
    # Published on this machine's loopback by the forwarder, as docker does.
    secure_port=6443
    start luaop-forwarder "$STATE/luaop-forwarder" -listen "127.0.0.1:$api_port" -to "$NODE_IP:6443"
  fi
  start_cp kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address "$api_bind" --advertise-address "$api_advertise" "${server_flags[@]}" \
    --secure-port "$secure_port" \
    --tls-cert-file "$STATE/apiserver.crt" --tls-private-key-file "$STATE/apiserver.key" \
    --client-ca-file "$STATE/ca.crt" --token-auth-file "$STATE/tokens.csv" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$STATE/sa.pub" --service-account-signing-key-file "$STATE/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --max-requests-inflight 2000 --max-mutating-requests-inflight 1000 \
    --enable-priority-and-fairness=false ${extra_apiserver_flags[@]+"${extra_apiserver_flags[@]}"}
  for _ in $(seq 1 300); do
    ready "$api_port" && break
    kill -0 "$(cat kube-apiserver.pid)" 2>/dev/null || break
    sleep 0.1
  done
  if ready "$api_port"; then break; fi
  log "kube-apiserver did not become ready on port $api_port (attempt $attempt): $(tail -3 kube-apiserver.log)"
  kill "$(cat kube-apiserver.pid)" 2>/dev/null || true
  [ -f luaop-forwarder.pid ] && kill "$(cat luaop-forwarder.pid)" 2>/dev/null || true
  [ "$attempt" = 3 ] && die "kube-apiserver failed to start; see $STATE/kube-apiserver.log"
done
echo "$api_port" > apiserver.port

cat > "$KUBECONFIG_OUT" <<KC
apiVersion: v1
kind: Config
clusters:
- name: luaop-local
  cluster:
    server: https://$ADDR:$api_port
    certificate-authority: $STATE/ca.crt
users:
- name: admin
  user:
    token: $(cat token)
contexts:
- name: luaop-local
  context: {cluster: luaop-local, user: admin}
current-context: luaop-local
KC
chmod 600 "$KUBECONFIG_OUT"

# The controller manager reaches the API server where it runs: in the namespace with
# the netns topology.
cm_kubeconfig=$KUBECONFIG_OUT
if [ "$TOPOLOGY" = netns ]; then
  cm_kubeconfig="$STATE/inner.kubeconfig"
  sed "s|server: https://127.0.0.1:$api_port|server: https://127.0.0.1:6443|" "$KUBECONFIG_OUT" > "$cm_kubeconfig"
  chmod 600 "$cm_kubeconfig"
  # The Node kind's control-plane node is, with its InternalIP (no kubelet runs).
  node_json=$(printf '{"apiVersion":"v1","kind":"Node","metadata":{"name":"luaop-control-plane","labels":{"kubernetes.io/hostname":"luaop-control-plane","node-role.kubernetes.io/control-plane":""}},"status":{"addresses":[{"type":"InternalIP","address":"%s"},{"type":"Hostname","address":"luaop-control-plane"}]}}' "$NODE_IP")
  curl -fsS --max-time 10 --cacert ca.crt -H "Authorization: Bearer $(cat token)" -H 'Content-Type: application/json' \
    -X POST --data "$node_json" "https://127.0.0.1:$api_port/api/v1/nodes" >/dev/null ||
    die "creating the Node luaop-control-plane"
fi

# The garbage collector cascades owner references; the namespace controller really
# deletes test namespaces. Nothing else is needed unless a node runs pods (LUAOP_FOR_NODE).
start_cp kube-controller-manager "$BIN/kube-controller-manager" \
  --kubeconfig "$cm_kubeconfig" --authentication-kubeconfig "$cm_kubeconfig" --authorization-kubeconfig "$cm_kubeconfig" \
  --controllers="$controllers" \
  --leader-elect=false --secure-port=0 \
  --service-account-private-key-file "$STATE/sa.key" --root-ca-file "$STATE/ca.crt" \
  --concurrent-gc-syncs 5 --concurrent-namespace-syncs 5

where=""
[ "$TOPOLOGY" = netns ] && where=" (published from $NODE_IP:6443 in network namespace $NETNS)"
log "kube-apiserver ready at https://$ADDR:$api_port$where in $(( $(date +%s) - t0 ))s"
log "use it with: export KUBECONFIG=$KUBECONFIG_OUT"
echo "$KUBECONFIG_OUT"
