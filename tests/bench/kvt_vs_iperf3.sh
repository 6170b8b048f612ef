#!/usr/bin/env bash
# kvt-bench --op write against iperf3 on the same loopback, in one run:
# iperf3 with 1 and 4 streams, kvt-bench (TCP transport) with 1 and 4 lanes;
# prints GB/s of each and the ratios (target: kvt 1 lane >= 0.9 x iperf3
# single stream, kvt 4 lanes above it).
# Usage: kvt_vs_iperf3.sh [BIN_DIR]   env: DUR=seconds per run (default 5),
#        BLOCK (default 1M), BATCH (default 16)
here=$(cd "$(dirname "$0")" && pwd)
BIN_DIR=${1:-${BIN_DIR:-$here/../../build/bin}}
source "$here/lib.sh"
DUR=${DUR:-5}
BLOCK=${BLOCK:-1M}
BATCH=${BATCH:-16}

command -v iperf3 >/dev/null || { echo "iperf3 not installed (PDGW_DEPS_BENCH=1 deploy/install-deps.sh)" >&2; exit 2; }
[[ -x "$BIN_DIR/kvt-bench" ]] || { echo "$BIN_DIR/kvt-bench not built" >&2; exit 2; }

# iperf3_gbps STREAMS [WRITE_LEN]: receiver-side GB/s of one run
iperf3_gbps() {
    local port len=()
    port=$(free_port)
    [[ -n "${2:-}" ]] && len=(-l "$2")
    bench_start iperf3-server iperf3 -s -1 -p "$port"
    sleep 0.3
    iperf3 -c 127.0.0.1 -p "$port" -t "$DUR" -P "$1" "${len[@]}" -J >"$BENCH_TMP/iperf3-$1.json"
    /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.3f" % (d["end"]["sum_received"]["bits_per_second"]/8e9))' "$BENCH_TMP/iperf3-$1.json"
}

# kvt_gbps LANES: kvt-bench write GB/s (data verified on the target)
kvt_gbps() {
    local port out
    port=$(free_port)
    bench_start kvt-target "$BIN_DIR/kvt-bench" --mode target --port "$port" --block-size "$BLOCK" \
        --buffer-size 256M
    sleep 0.3
    out=$("$BIN_DIR/kvt-bench" --mode initiator --port "$port" --op write --block-size "$BLOCK" \
        --batch "$BATCH" --lanes "$1" --duration "$DUR")
    echo "$out" | grep -v '^RESULT' >&2
    echo "$out" | grep -q 'verified=1' || { echo "kvt-bench: data not verified" >&2; echo 0; return; }
    echo "$out" | sed -n 's/^RESULT .* gbps=\([0-9.]*\).*/\1/p'
}

i1d=$(iperf3_gbps 1)
i1=$(iperf3_gbps 1 "$BLOCK") # same write size as kvt: the fair single-stream baseline
i4=$(iperf3_gbps 4 "$BLOCK")
k1=$(kvt_gbps 1)
k4=$(kvt_gbps 4)
ratio() { /usr/bin/python3 -c "import sys; a,b=map(float,sys.argv[1:]); print('%.2f' % (a/b if b else 0))" "$1" "$2"; }
summary=$(cat <<EOT
kvt vs iperf3 (loopback, ${DUR}s each, block $BLOCK x batch $BATCH)
  iperf3  1 stream (default 128K writes): $i1d GB/s
  iperf3  1 stream (-l $BLOCK): $i1 GB/s
  iperf3  4 streams (-l $BLOCK): $i4 GB/s
  kvt     1 lane   : $k1 GB/s   ratio vs iperf3 1 stream: $(ratio "$k1" "$i1")
  kvt     4 lanes  : $k4 GB/s   ratio vs iperf3 1 stream: $(ratio "$k4" "$i1"), vs 4 streams: $(ratio "$k4" "$i4")
EOT
)
echo "$summary"
echo "$summary" >"$RESULTS_DIR/kvt_vs_iperf3.summary"
echo "iperf3_1_default,iperf3_1,iperf3_4,kvt_1,kvt_4" >"$RESULTS_DIR/kvt_vs_iperf3.csv"
echo "$i1d,$i1,$i4,$k1,$k4" >>"$RESULTS_DIR/kvt_vs_iperf3.csv"
