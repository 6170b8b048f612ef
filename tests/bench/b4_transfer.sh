#!/usr/bin/env bash
# B4 transfer: kvt-bench (libkvt TCP transport, --op write, data verified on the
# target) against iperf3 on the same loopback, in one run, for every block size
# from 4 KiB to 4 MiB: iperf3 one stream with writes of the block size, kvt-bench
# with 1 and 4 lanes. Then the allocation handshake round trip (AllocRequest ->
# AllocResponse against a receiver engine), p50/p99. iperf3 writes at most 1 MiB at a
# time, so blocks above 1 MiB are compared with iperf3 writing 1 MiB.
# Usage: b4_transfer.sh [BIN_DIR]
#   env: DUR (s per point, default 2), BLOCKS ("4K 16K 64K 256K 1M 4M"),
#        BATCH (blocks per posted batch, default 16), HEADLINE_BLOCK (1M),
#        ROUNDS (3: every point is the mean of ROUNDS runs, order alternating)
source "$(dirname "$0")/lib.sh"
BIN_DIR=${1:-$BIN_DIR}
DUR=${DUR:-2}
BLOCKS=${BLOCKS:-"4K 16K 64K 256K 1M 4M"}
BATCH=${BATCH:-16}
ROUNDS=${ROUNDS:-3}
HEADLINE_BLOCK=${HEADLINE_BLOCK:-1M}
need iperf3 "$BIN_DIR/kvt-bench"

bytes_of() {
    awk -v s="$1" 'BEGIN { n = s + 0; if (s ~ /[Kk]$/) n *= 1024; else if (s ~ /M$/) n *= 1048576;
        else if (s ~ /G$/) n *= 1073741824; printf "%d", n }'
}

# iperf3_gbps STREAMS [WRITE_LEN]: receiver-side GB/s of one run ("0" on failure).
iperf3_gbps() {
    local port len=() pid
    port=$(free_port)
    # iperf3 refuses writes above 1 MiB: larger blocks compare against 1 MiB writes
    if [[ -n "${2:-}" ]]; then
        if (($(bytes_of "$2") > 1048576)); then len=(-l 1M); else len=(-l "$2"); fi
    fi
    bench_start iperf3-server iperf3 -s -1 -p "$port"
    pid=$LAST_PID
    for _ in $(seq 50); do
        ss -ltn "sport = :$port" 2>/dev/null | grep -q LISTEN && break
        sleep 0.05
    done
    if ! iperf3 -c 127.0.0.1 -p "$port" -t "$DUR" -P "$1" "${len[@]}" -J >"$BENCH_TMP/iperf3.json" 2>&1; then
        echo "B4 iperf3 failed: $(head -c 300 "$BENCH_TMP/iperf3.json")" >&2
        echo 0
        return
    fi
    wait "$pid" 2>/dev/null || true
    /usr/bin/python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("%.3f" % (d["end"]["sum_received"]["bits_per_second"]/8e9))' "$BENCH_TMP/iperf3.json"
}

# kvt_run LANES BLOCK: prints "gbps p50_us p99_us" of kvt-bench write ("0 - -" on failure).
kvt_run() {
    local port out pid buf
    port=$(free_port)
    buf=$(($(bytes_of "$2") * BATCH * 4))
    ((buf < 64 * 1048576)) && buf=$((64 * 1048576))
    bench_start kvt-target "$BIN_DIR/kvt-bench" --mode target --port "$port" --block-size "$2" \
        --buffer-size "$buf"
    pid=$LAST_PID
    for _ in $(seq 50); do
        ss -ltn "sport = :$port" 2>/dev/null | grep -q LISTEN && break
        sleep 0.05
    done
    out=$(timeout $((DUR + 30)) "$BIN_DIR/kvt-bench" --mode initiator --port "$port" --op write \
        --block-size "$2" --batch "$BATCH" --lanes "$1" --duration "$DUR" 2>&1 || true)
    wait "$pid" 2>/dev/null || true
    if ! grep -q '^RESULT.*verified=1' <<<"$out"; then
        echo "B4 kvt-bench lanes=$1 block=$2 failed or not verified: $(tail -n 2 <<<"$out")" >&2
        echo "0 - -"
        return
    fi
    sed -n 's/^RESULT .* gbps=\([0-9.]*\).* p50_us=\([0-9.]*\) p99_us=\([0-9.]*\).*/\1 \2 \3/p' <<<"$out"
}

echo "B4 load before: $(load_avg)"
csv=$RESULTS_DIR/b4_transfer.csv
echo "block,block_bytes,iperf3_1_gbps,kvt_1lane_gbps,kvt_4lane_gbps,kvt1_over_iperf3,kvt4_over_iperf3,kvt1_batch_p50_us,kvt1_batch_p99_us,load1" >"$csv"
mean() { awk '{ s = 0; n = 0; for (i = 1; i <= NF; i++) if ($i != "-") { s += $i; n++ } printf (n ? "%.3f" : "0"), (n ? s / n : 0) }' <<<"$*"; }
for b in $BLOCKS; do
    i1s="" k1s="" k4s="" p50s="" p99s=""
    for ((r = 0; r < ROUNDS; r++)); do
        # alternate the order so drift of a shared machine hits both alike
        if ((r % 2 == 0)); then
            i1s+=" $(iperf3_gbps 1 "$b")"
            read -r k1 k1p50 k1p99 <<<"$(kvt_run 1 "$b")"
            read -r k4 _ _ <<<"$(kvt_run 4 "$b")"
        else
            read -r k4 _ _ <<<"$(kvt_run 4 "$b")"
            read -r k1 k1p50 k1p99 <<<"$(kvt_run 1 "$b")"
            i1s+=" $(iperf3_gbps 1 "$b")"
        fi
        k1s+=" $k1" k4s+=" $k4" p50s+=" $k1p50" p99s+=" $k1p99"
    done
    i1=$(mean $i1s) k1=$(mean $k1s) k4=$(mean $k4s) k1p50=$(mean $p50s) k1p99=$(mean $p99s)
    r1=$(awk -v a="$k1" -v b="$i1" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
    r4=$(awk -v a="$k4" -v b="$i1" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
    echo "$b,$(bytes_of "$b"),$i1,$k1,$k4,$r1,$r4,$k1p50,$k1p99,$(load_avg | cut -d' ' -f1)" >>"$csv"
    printf 'B4 block %-5s iperf3 1 stream %7s GB/s  kvt 1 lane %7s GB/s (%s x)  kvt 4 lanes %7s GB/s (%s x)   rounds: iperf3%s kvt1%s kvt4%s\n' \
        "$b" "$i1" "$k1" "$r1" "$k4" "$r4" "$i1s" "$k1s" "$k4s"
done
idef=$(iperf3_gbps 1)
echo "B4 iperf3 1 stream with its default 128 KiB writes: $idef GB/s"

# allocation handshake round trip against a receiver engine
port=$(free_port)
bench_start kvt-recv "$BIN_DIR/kvt-bench" --mode recv --port "$port"
for _ in $(seq 50); do
    ss -ltn "sport = :$port" 2>/dev/null | grep -q LISTEN && break
    sleep 0.05
done
hs=$(timeout $((DUR + 30)) "$BIN_DIR/kvt-bench" --mode initiator --op alloc --port "$port" \
    --batch "$BATCH" --duration "$DUR" 2>&1 | grep '^RESULT' || true)
hs50=$(sed -n 's/.* p50_us=\([0-9.]*\).*/\1/p' <<<"$hs")
hs99=$(sed -n 's/.* p99_us=\([0-9.]*\).*/\1/p' <<<"$hs")
hsn=$(sed -n 's/.* n=\([0-9]*\).*/\1/p' <<<"$hs")
echo "round_trips,batch,p50_us,p99_us,load1" >"$RESULTS_DIR/b4_handshake.csv"
echo "${hsn:-0},$BATCH,${hs50:--},${hs99:--},$(load_avg | cut -d' ' -f1)" >>"$RESULTS_DIR/b4_handshake.csv"
echo "B4 allocation handshake ($BATCH keys): ${hsn:-0} round trips, p50 ${hs50:--} us, p99 ${hs99:--} us"

if command -v gnuplot >/dev/null 2>&1; then
    gnuplot <<GP
set terminal pngcairo size 900,500 noenhanced
set output '$RESULTS_DIR/b4_transfer.png'
set title 'B4: loopback bandwidth vs block size (kvt batch $BATCH, ${DUR}s per point)'
set xlabel 'block size (bytes)'
set ylabel 'GB/s'
set logscale x 2
set grid
set key top left
set datafile separator ','
plot '$csv' every ::1 using 2:3:xtic(1) with linespoints title 'iperf3 1 stream (-l block)', \
     '' every ::1 using 2:4 with linespoints title 'kvt 1 lane', \
     '' every ::1 using 2:5 with linespoints title 'kvt 4 lanes'
GP
fi

summary_begin b4_transfer
h=$(awk -F, -v b="$HEADLINE_BLOCK" '$1 == b { print $6 }' "$csv")
check_target b4 "kvt 1 lane / iperf3 1 stream, block $HEADLINE_BLOCK" "$h" ge 0.9 x
h4=$(awk -F, -v b="$HEADLINE_BLOCK" '$1 == b { print $7 }' "$csv")
check_target b4 "kvt 4 lanes / iperf3 1 stream, block $HEADLINE_BLOCK" "$h4" ge 1.0 x
info_row b4 "allocation handshake ($BATCH keys) p50/p99" "${hs50:--}/${hs99:--}" us
best=$(awk -F, 'NR > 1 && $6 + 0 > m { m = $6 + 0 } END { printf "%.2f", m }' "$csv")
echo "B4 best kvt 1 lane / iperf3 ratio over block sizes: $best"
echo "machine: $(machine_line)"
