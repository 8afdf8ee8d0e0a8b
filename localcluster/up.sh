#!/usr/bin/env bash
# Starts a local Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager)
# on loopback and prints the path of its admin kubeconfig on stdout. Idempotent: when the
# cluster recorded in the state folder is already up, it only prints the path again.
# Progress goes to stderr. Stop it with localcluster/down.sh.
#
#   KUBECONFIG=$(localcluster/up.sh)
#   LUAOP_APISERVER_FLAGS='--feature-gates=CBORServingAndStorage=true' localcluster/up.sh
#                                     # extra kube-apiserver flags (split on spaces)
#
# A control plane for a node (localcluster/node-up.sh sets these; see there):
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
ADDR="${LUAOP_APISERVER_ADDRESS:-127.0.0.1}"
SERVICE_CIDR="${LUAOP_SERVICE_CIDR:-10.0.0.0/24}"
FOR_NODE="${LUAOP_FOR_NODE:-}"

log() { printf '[localcluster] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# etcd reads every ETCD_* variable as a flag: drop whatever the caller exported.
while IFS='=' read -r name _; do
  case "$name" in ETCD_*) unset "$name" ;; esac
done < <(env)

ready() { # ready <port>: /readyz answers ok
  [ -f "$STATE/ca.crt" ] && [ -f "$STATE/token" ] || return 1
  curl -fsS --max-time 2 --cacert "$STATE/ca.crt" -H "Authorization: Bearer $(cat "$STATE/token")" \
    "https://$ADDR:$1/readyz" 2>/dev/null | grep -qx ok
}

if [ -f "$STATE/apiserver.port" ] && ready "$(cat "$STATE/apiserver.port")"; then
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

# The first address of the Services' range: the `kubernetes` Service, which pods dial
# by IP (KUBERNETES_SERVICE_HOST), so it is in the serving certificate.
service_ip() { local net=${1%/*} a b c d; IFS=. read -r a b c d <<< "$net"; echo "$a.$b.$c.$((d + 1))"; }
sans="IP:127.0.0.1,IP:$(service_ip "$SERVICE_CIDR"),DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
[ "$ADDR" = 127.0.0.1 ] || sans="IP:$ADDR,$sans"
serving_ext="$(printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth\n' "$sans")"
if [ ! -f ca.crt ] || [ ! -f apiserver.crt ] || [ ! -f sa.key ]; then
  log "generating a CA, a serving certificate and service-account keys"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=luaop-local-ca" \
    -keyout ca.key -out ca.crt 2>/dev/null
  rm -f apiserver.ext
  openssl genrsa -out sa.key 2048 2>/dev/null
  openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > token
  printf '%s,admin,admin,system:masters\n' "$(cat token)" > tokens.csv
fi
# A serving certificate for this address and Services' range (made again when they change).
if [ ! -f apiserver.crt ] || [ "$(cat apiserver.ext 2>/dev/null)" != "$serving_ext" ]; then
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout apiserver.key -out apiserver.csr 2>/dev/null
  printf '%s\n' "$serving_ext" > apiserver.ext
  openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
    -extfile apiserver.ext -out apiserver.crt 2>/dev/null
fi

# Loopback cannot be the `kubernetes` Service's endpoint ("cannot use public IP
# 127.0.0.1 with endpoint reconciler"): that Service then has none. Another address is
# kept as its endpoint by the server itself (the lease reconciler, the default).
server_flags=()
[ "$ADDR" = 127.0.0.1 ] && server_flags+=(--endpoint-reconciler-type none)
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

t0=$(date +%s)
for attempt in 1 2 3; do
  etcd_port=$(pick_port)
  start etcd "$BIN/etcd" --data-dir "$STATE/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$((etcd_port + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
    --initial-cluster "default=http://127.0.0.1:$((etcd_port + 1))" \
    --unsafe-no-fsync --logger zap --log-level warn --quota-backend-bytes 8589934592
  for _ in $(seq 1 100); do
    curl -fsS --max-time 1 "http://127.0.0.1:$etcd_port/health" 2>/dev/null | grep -q '"health":"true"' && break
    kill -0 "$(cat etcd.pid)" 2>/dev/null || break
    sleep 0.1
  done
  # A healthy answer may come from another etcd that took the port meanwhile (ours
  # then failed with "address already in use"): it must be ours, still running.
  if curl -fsS --max-time 1 "http://127.0.0.1:$etcd_port/health" 2>/dev/null | grep -q '"health":"true"' &&
    kill -0 "$(cat etcd.pid)" 2>/dev/null && ! grep -q "address already in use" etcd.log; then
    break
  fi
  log "etcd did not start on port $etcd_port (attempt $attempt): $(tail -2 etcd.log)"
  kill "$(cat etcd.pid)" 2>/dev/null || true
  [ "$attempt" = 3 ] && die "etcd failed to start; see $STATE/etcd.log"
done
log "etcd up on 127.0.0.1:$etcd_port"

read -r -a extra_apiserver_flags <<< "${LUAOP_APISERVER_FLAGS:-}"
for attempt in 1 2 3; do
  api_port=$(pick_port)
  start kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address "$ADDR" --advertise-address "$ADDR" "${server_flags[@]}" \
    --secure-port "$api_port" \
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

# The garbage collector cascades owner references; the namespace controller really
# deletes test namespaces. Nothing else is needed unless a node runs pods (LUAOP_FOR_NODE).
start kube-controller-manager "$BIN/kube-controller-manager" \
  --kubeconfig "$KUBECONFIG_OUT" --authentication-kubeconfig "$KUBECONFIG_OUT" --authorization-kubeconfig "$KUBECONFIG_OUT" \
  --controllers="$controllers" \
  --leader-elect=false --secure-port=0 \
  --service-account-private-key-file "$STATE/sa.key" --root-ca-file "$STATE/ca.crt" \
  --concurrent-gc-syncs 5 --concurrent-namespace-syncs 5

log "kube-apiserver ready at https://$ADDR:$api_port in $(( $(date +%s) - t0 ))s"
log "use it with: export KUBECONFIG=$KUBECONFIG_OUT"
echo "$KUBECONFIG_OUT"
