#!/usr/bin/env bash
# Build the container image and prove it serves: a pdgw-sim container and a pdgw container on
# their own Docker network, a streamed chat completion through the gateway, the health check
# reported healthy, and the process running as the unprivileged user.
#
#   deploy/docker/check-image.sh            (from anywhere; needs a running Docker daemon)
#
# Base image: $DEBIAN_IMAGE if set, else debian:bookworm-slim when it is present or can be
# pulled, else one made here from Debian's archive with debootstrap (minbase) and
# `docker import` - for machines that reach Debian's mirror but not a container registry.
set -euo pipefail

src=$(cd "$(dirname "$0")/../.." && pwd)
tag=${PDGW_IMAGE_TAG:-pdgw:check}
net=pdgw-check-$$
work=$(mktemp -d)

if ! command -v docker >/dev/null || ! docker info >/dev/null 2>&1; then
    echo "SKIP no usable Docker daemon (docker info failed)"
    exit 0
fi

cleanup() {
    docker rm -f "$net-sim" "$net-gw" >/dev/null 2>&1 || true
    docker network rm "$net" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

base=${DEBIAN_IMAGE:-}
if [[ -z $base ]]; then
    if docker image inspect debian:bookworm-slim >/dev/null 2>&1 ||
        docker pull -q debian:bookworm-slim >/dev/null 2>&1; then
        base=debian:bookworm-slim
    else
        base=pdgw-base/debian:bookworm
        if ! docker image inspect "$base" >/dev/null 2>&1; then
            command -v debootstrap >/dev/null ||
                { echo "FAIL no registry and no debootstrap to make a base image" >&2; exit 1; }
            root=${PDGW_BASE_ROOT:-$work/rootfs}
            if [[ ! -x $root/usr/bin/apt-get ]]; then
                echo "check-image: debootstrap bookworm (minbase) for the base image"
                debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian \
                    >"$work/debootstrap.log" 2>&1 || { tail -n 20 "$work/debootstrap.log"; exit 1; }
            fi
            tar -C "$root" --exclude=./proc --exclude=./sys --exclude=./dev -cf - . |
                docker import - "$base" >/dev/null
        fi
    fi
fi

echo "check-image: docker build (base $base) -> $tag"
start=$(date +%s)
if ! docker build -q -f "$src/deploy/docker/Dockerfile" --build-arg "DEBIAN_IMAGE=$base" \
    -t "$tag" "$src" >"$work/build.log" 2>&1; then
    tail -n 40 "$work/build.log"
    echo "FAIL docker build" >&2
    exit 1
fi
echo "check-image: built in $(($(date +%s) - start)) s, $(docker image inspect -f '{{.Size}}' "$tag" |
    awk '{printf "%.0f MB", $1 / 1e6}')"

docker network create "$net" >/dev/null
docker run -d --name "$net-sim" --network "$net" --network-alias sim -e HEALTHCHECK_PORT=8100 \
    "$tag" pdgw-sim --role both --host 0.0.0.0 --port 8100 >/dev/null
docker run -d --name "$net-gw" --network "$net" "$tag" \
    pdgw --listen 0.0.0.0:8000 --protocol neutral --both http://sim:8100 >/dev/null

# Wait on the conditions themselves: the gateway ready (its engine healthy), then Docker's own
# health check reporting healthy for both containers.
wait_for() { # what, command...
    local what=$1 i
    shift
    for ((i = 0; i < 120; i++)); do
        if "$@" >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.5
    done
    echo "FAIL $what" >&2
    docker logs "$net-gw" 2>&1 | tail -n 20 >&2
    docker logs "$net-sim" 2>&1 | tail -n 20 >&2
    exit 1
}
health() { [[ $(docker inspect -f '{{.State.Health.Status}}' "$1") == healthy ]]; }
wait_for "gateway never became ready" docker exec "$net-gw" curl -fsS http://127.0.0.1:8000/ready
wait_for "sim health check never healthy" health "$net-sim"
wait_for "gateway health check never healthy" health "$net-gw"

out=$(docker exec "$net-gw" curl -fsSN http://127.0.0.1:8000/v1/chat/completions \
    -H 'Content-Type: application/json' \
    -d '{"model":"sim-model","stream":true,"max_tokens":8,
         "messages":[{"role":"user","content":"hello from the image check"}]}')
chunks=$(grep -c '^data: {' <<<"$out" || true)
if [[ $chunks -lt 2 ]] || ! grep -q '^data: \[DONE\]' <<<"$out"; then
    echo "FAIL streamed answer through the gateway container:" >&2
    echo "$out" >&2
    exit 1
fi
user=$(docker exec "$net-gw" id -u)
if [[ $user != 10001 ]]; then
    echo "FAIL the gateway runs as uid $user, not 10001" >&2
    exit 1
fi
echo "check-image: PASS ($chunks streamed chunks through $tag, both containers healthy, uid $user)"
