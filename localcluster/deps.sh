#!/usr/bin/env bash
# Installs the system tools the local control plane scripts use, when missing.
set -euo pipefail
missing=()
command -v openssl >/dev/null || missing+=(openssl)
command -v curl >/dev/null || missing+=(curl)
command -v setsid >/dev/null || missing+=(util-linux)
# The kind-like topology (LUAOP_CLUSTER_TOPOLOGY=netns, and e2e/kindlike) makes a
# network namespace: ip, as root (without root there is none to make).
if [ "${LUAOP_CLUSTER_TOPOLOGY:-host}" = netns ] || [ "$(id -u)" = 0 ]; then command -v ip >/dev/null || missing+=(iproute2); fi
[ ${#missing[@]} -eq 0 ] && exit 0
echo "[localcluster] installing ${missing[*]}" >&2
if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
$SUDO apt-get update -qq >&2 && $SUDO apt-get install -y -qq "${missing[@]}" >&2
