#!/usr/bin/env bash
# Installs the system packages a node of localcluster/node-up.sh needs, when missing:
# Debian's CNI plugins (bridge, host-local, loopback, portmap in /usr/lib/cni), iptables
# (kube-proxy's rules, inside the node's network namespace), libseccomp-dev and gcc
# (runc is built with seccomp, through cgo), iproute2 and util-linux (ip netns, veth,
# nsenter, unshare).
set -euo pipefail
missing=()
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] || missing+=(containernetworking-plugins)
command -v iptables >/dev/null || missing+=(iptables)
[ -f /usr/include/seccomp.h ] || missing+=(libseccomp-dev)
command -v gcc >/dev/null || missing+=(gcc)
command -v pkg-config >/dev/null || missing+=(pkg-config)
command -v ip >/dev/null || missing+=(iproute2)
command -v nsenter >/dev/null && command -v unshare >/dev/null || missing+=(util-linux)
command -v curl >/dev/null || missing+=(curl)
command -v openssl >/dev/null || missing+=(openssl)
[ ${#missing[@]} -eq 0 ] && exit 0
echo "[localcluster node] installing ${missing[*]}" >&2
if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >&2 && $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
