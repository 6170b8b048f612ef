#!/usr/bin/env bash
# Installs every Debian package that building, the demo and the tests need.
# Idempotent: packages already present are skipped, and apt is not touched at all
# when nothing is missing.
set -euo pipefail

PACKAGES=(
    build-essential cmake pkg-config clang
    libmicrohttpd-dev libcurl4-openssl-dev libjansson-dev libzmq3-dev
    libmsgpack-dev libyaml-dev libibverbs-dev libcmocka-dev libxxhash-dev
    curl iproute2 procps python3 python3-msgpack python3-zmq python3-yaml
    prometheus kubectl
)
# Node.js (with npm) validates the Kubernetes manifests; some images ship it from
# elsewhere, so look for the commands before asking dpkg.
if ! command -v npm >/dev/null 2>&1; then
    PACKAGES+=(nodejs npm)
fi
if [[ "${PDGW_DEPS_BENCH:-0}" == 1 ]]; then
    PACKAGES+=(wrk nginx iperf3 gnuplot-nox linux-perf valgrind)
fi

missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
if ((${#missing[@]} == 0)); then
    exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
    SUDO=sudo
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
