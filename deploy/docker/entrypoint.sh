#!/bin/sh
# Container entrypoint: one image runs the gateway, the simulator or the
# benchmark.
#   <no args>              pdgw --config /etc/pdgw/pdgw.yaml
#   pdgw|pdgw-sim|kvt-bench [args...]   that binary with its arguments
#   -*|--*                 pdgw with those arguments (flags only)
#   anything else          executed as given (e.g. sh for debugging)
set -eu

if [ "$#" -eq 0 ]; then
    exec pdgw --config /etc/pdgw/pdgw.yaml
fi

case "$1" in
pdgw | pdgw-sim | kvt-bench)
    cmd="$1"
    shift
    exec "$cmd" "$@"
    ;;
-*)
    exec pdgw "$@"
    ;;
*)
    exec "$@"
    ;;
esac
