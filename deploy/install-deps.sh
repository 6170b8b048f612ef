#!/usr/bin/env bash
# Installs the Debian 12 packages one job needs, from Debian's archive only.
#   install-deps.sh [build|demo|test|bench]...          (default: build)
#   install-deps.sh --list [build|demo|test|bench]...   print the packages, install nothing
# build  compiler, CMake and the libraries pdgw links
# demo   build + curl and python3 (the demo streams through pdgw with them; make build-pgo
#        trains with them)
# test   demo + cmocka, Python test drivers, promtool, clang (fuzzing), Node.js,
#        openssl (the TLS test makes its own self-signed certificate), redis-server (the
#        quota store's tests start their own on loopback)
# bench  test + load generators, nginx, iperf3, gnuplot, perf
# Tools Debian does not ship (kubectl, for example) are never installed here: the
# tests that need one print a single "SKIP <why>" line when it is absent.
# Idempotent: apt is not touched at all when nothing is missing.
set -euo pipefail

BUILD_PKGS=(
    build-essential cmake pkg-config
    libmicrohttpd-dev libcurl4-openssl-dev libjansson-dev libzmq3-dev
    libmsgpack-dev libyaml-dev libibverbs-dev libxxhash-dev
    libhiredis-dev libgnutls28-dev libpcre2-dev libutf8proc-dev
)
DEMO_PKGS=(curl procps python3)
TEST_PKGS=(
    libcmocka-dev clang iproute2 python3 python3-msgpack python3-zmq python3-yaml
    prometheus openssl redis-server
)
BENCH_PKGS=(wrk nginx iperf3 gnuplot-nox linux-perf valgrind)

list_only=0
if [[ "${1:-}" == --list ]]; then
    list_only=1
    shift
fi
jobs=("$@")
if ((${#jobs[@]} == 0)); then
    jobs=(build)
fi
# Older callers asked for the bench set through the environment.
if [[ "${PDGW_DEPS_BENCH:-0}" == 1 ]]; then
    jobs+=(bench)
fi

PACKAGES=("${BUILD_PKGS[@]}")
for job in "${jobs[@]}"; do
    case "$job" in
    build) ;;
    demo) PACKAGES+=("${DEMO_PKGS[@]}") ;;
    test) PACKAGES+=("${DEMO_PKGS[@]}" "${TEST_PKGS[@]}") ;;
    bench) PACKAGES+=("${DEMO_PKGS[@]}" "${TEST_PKGS[@]}" "${BENCH_PKGS[@]}") ;;
    *)
        echo "install-deps: unknown job '$job' (build, demo, test or bench)" >&2
        exit 2
        ;;
    esac
    # Node.js validates the Kubernetes manifests; an image may carry it from
    # elsewhere, so look for the command before asking dpkg.
    if [[ "$job" == test || "$job" == bench ]] &&
        { ((list_only)) || ! command -v npm >/dev/null 2>&1; }; then
        PACKAGES+=(nodejs npm)
    fi
done

if ((list_only)); then
    printf '%s\n' "${PACKAGES[@]}" | awk '!seen[$0]++'
    exit 0
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
# De-duplicate while keeping the order.
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | awk '!seen[$0]++')

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
    SUDO=sudo
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
