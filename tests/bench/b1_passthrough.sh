#!/usr/bin/env bash
# B1 passthrough overhead: wrk (keep-alive) non-streaming completions against
# (a) pdgw-sim directly, (b) nginx proxy_pass with upstream keep-alive to the same
# sim, (c) pdgw --protocol neutral to the same sim as it ships (upstream legs on its own
# HTTP/1.1 client and its own HTTP/1.x server in front), (d) the same with --upstream-client curl
# ("pdgwc": legs on libcurl), (e) the same as (c) with --frontend mhd ("pdgwm": libmicrohttpd in
# front), in one run. The targets apply to (c); (e) says what the front end changes. Every connection
# count is measured ROUNDS times with the order of the three targets alternating
# (drift of a shared machine hits all three alike); figures are the mean of the
# rounds. Besides req/s and latency, the proxies' CPU time per request is taken
# from /proc (robust against other load on the machine).
# At saturation (closed loop) latency follows throughput (Little's law), so the
# point "64p" runs 64 connections with THINK_MS of think time per request (wrk's
# delay()), well below saturation: the latency a proxy adds when it is not the
# bottleneck.
# Usage: b1_passthrough.sh [BIN_DIR]
#   env: DURATION (s per wrk run, default 5), CONNS ("1 64 64p 256"), ROUNDS (3),
#        THINK_MS (20), WORKERS (proxy worker threads/processes, default 2), WRK_THREADS (2)
source "$(dirname "$0")/lib.sh"
BIN_DIR=${1:-$BIN_DIR}
DURATION=${DURATION:-5}
CONNS=${CONNS:-"1 64 64p 256"}
THINK_MS=${THINK_MS:-20}
ROUNDS=${ROUNDS:-3}
WORKERS=${WORKERS:-2}
WRK_THREADS=${WRK_THREADS:-2}
need wrk nginx curl "$BIN_DIR/pdgw" "$BIN_DIR/pdgw-sim"
raise_nofile >/dev/null

sim_port=$(free_port)
nginx_port=$(free_port)
pdgw_port=$(free_port)
pdgwc_port=$(free_port)
pdgwm_port=$(free_port)

bench_start sim "$BIN_DIR/pdgw-sim" --role both --port "$sim_port" --zero-delay \
    --max-tokens-default 16 --record-capacity 0 --max-batch 4096
wait_http "$sim_port" /health

nginx_start "$WORKERS" 16384 "$(nginx_proxy_block "$sim_port" "$nginx_port" 512)"
nginx_pid=$LAST_PID
bench_start pdgw "$BIN_DIR/pdgw" --listen "127.0.0.1:$pdgw_port" --protocol neutral \
    --both "http://127.0.0.1:$sim_port" --workers "$WORKERS" --log-level warn --no-access-log
pdgw_pid=$LAST_PID
bench_start pdgwc "$BIN_DIR/pdgw" --listen "127.0.0.1:$pdgwc_port" --protocol neutral \
    --both "http://127.0.0.1:$sim_port" --workers "$WORKERS" --log-level warn --no-access-log \
    --upstream-client curl
pdgwc_pid=$LAST_PID
bench_start pdgwm "$BIN_DIR/pdgw" --listen "127.0.0.1:$pdgwm_port" --protocol neutral \
    --both "http://127.0.0.1:$sim_port" --workers "$WORKERS" --log-level warn --no-access-log \
    --frontend mhd
pdgwm_pid=$LAST_PID
wait_http "$pdgw_port" /ready
wait_http "$pdgwm_port" /ready
wait_http "$pdgwc_port" /ready
wait_http "$nginx_port" /health

cat >"$BENCH_TMP/post.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"sim-model","prompt":"The quick brown fox jumps over the lazy dog","max_tokens":16}'
LUA
{
    cat "$BENCH_TMP/post.lua"
    echo "function delay() return $THINK_MS end"
} >"$BENCH_TMP/post-paced.lua"

# to_ms VALUE: wrk prints latencies as 812.00us / 1.23ms / 1.02s.
to_ms() {
    awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n *= 1;
        else if (v ~ /m$/) n *= 60000; else if (v ~ /s$/) n *= 1000; printf "%.3f", n }'
}

# pids_of NAME: the processes whose CPU a target costs beyond the sim.
pids_of() {
    case $1 in
    nginx) echo "$nginx_pid $(pgrep -P "$nginx_pid" | tr '\n' ' ')" ;;
    pdgw) echo "$pdgw_pid" ;;
    pdgwc) echo "$pdgwc_pid" ;;
    pdgwm) echo "$pdgwm_pid" ;;
    *) echo "" ;;
    esac
}

port_of() {
    case $1 in
    direct) echo "$sim_port" ;;
    nginx) echo "$nginx_port" ;;
    pdgw) echo "$pdgw_port" ;;
    pdgwc) echo "$pdgwc_port" ;;
    pdgwm) echo "$pdgwm_port" ;;
    esac
}

raw=$BENCH_TMP/raw.csv
: >"$raw"
echo "B1 load before: $(load_avg)"
for c in $CONNS; do
    nconn=${c%p}
    script=$BENCH_TMP/post.lua
    [[ "$c" == *p ]] && script=$BENCH_TMP/post-paced.lua
    t=$WRK_THREADS
    ((nconn < t)) && t=$nconn
    for ((r = 0; r < ROUNDS; r++)); do
        order="direct nginx pdgw pdgwc pdgwm"
        ((r % 2 == 1)) && order="pdgwm pdgwc pdgw nginx direct"
        for name in $order; do
            pids=$(pids_of "$name")
            cpu0=$(proc_cpu_s $pids)
            out=$(wrk -t "$t" -c "$nconn" -d "${DURATION}s" --latency -s "$script" \
                "http://127.0.0.1:$(port_of "$name")/v1/completions")
            cpu1=$(proc_cpu_s $pids)
            rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
            total=$(awk '/requests in/ {print $1}' <<<"$out")
            p50=$(to_ms "$(awk '$1 == "50%" {print $2}' <<<"$out")")
            p99=$(to_ms "$(awk '$1 == "99%" {print $2}' <<<"$out")")
            non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
            errs=$(awk '/Socket errors/ {print $0}' <<<"$out")
            cpu_us=$(awk -v a="$cpu0" -v b="$cpu1" -v n="${total:-0}" \
                'BEGIN { printf "%.1f", (n > 0 ? (b - a) / n * 1e6 : 0) }')
            [[ -z "$pids" ]] && cpu_us=-
            echo "$name,$c,$r,$rps,$p50,$p99,${non2xx:-0},$cpu_us,$(load_avg | cut -d' ' -f1)" >>"$raw"
            printf 'B1 %-6s c=%-4s round %d %10s req/s  p50 %8s ms  p99 %8s ms  non-2xx %s  proxy cpu %s us/req %s\n' \
                "$name" "$c" "$r" "$rps" "$p50" "$p99" "${non2xx:-0}" "$cpu_us" "$errs"
        done
    done
done

csv=$RESULTS_DIR/b1_passthrough.csv
echo "label,target,conns,req_per_s,p50_ms,p99_ms,non2xx,proxy_cpu_us_per_req,load1" >"$csv"
awk -F, '{ k = $1 "," $2; if (!(k in n)) order[++m] = k; n[k]++; rps[k] += $4; p50[k] += $5;
    p99[k] += $6; bad[k] += $7; cpu[k] += $8; cpuset[k] = ($8 != "-"); load[k] += $9 }
    END { for (i = 1; i <= m; i++) { k = order[i]; split(k, a, ",");
        printf "%s@%s,%s,%s,%.0f,%.3f,%.3f,%d,%s,%.2f\n", a[1], a[2], a[1], a[2], rps[k] / n[k],
            p50[k] / n[k], p99[k] / n[k], bad[k], cpuset[k] ? sprintf("%.1f", cpu[k] / n[k]) : "-",
            load[k] / n[k] } }' "$raw" >>"$csv"
column -s, -t "$csv"
if command -v gnuplot >/dev/null 2>&1; then
    # wide table: connections, then req/s, p50 and p99 of direct, nginx, pdgw, pdgwc, pdgwm
    awk -F, 'NR > 1 { v[$2, $3, "r"] = $4; v[$2, $3, "5"] = $5; v[$2, $3, "9"] = $6;
        if (!($3 in seen)) { seen[$3] = 1; o[++n] = $3 } }
        END { for (i = 1; i <= n; i++) { c = o[i]; printf "%s", c;
            split("r 5 9", ks, " ");
            for (k = 1; k <= 3; k++) printf " %s %s %s %s %s", v["direct", c, ks[k]], v["nginx", c, ks[k]], v["pdgw", c, ks[k]], v["pdgwc", c, ks[k]], v["pdgwm", c, ks[k]];
            printf "\n" } }' "$csv" >"$BENCH_TMP/b1.dat"
    gnuplot <<GP
set terminal pngcairo size 1200,500 noenhanced
set output '$RESULTS_DIR/b1_passthrough.png'
set multiplot layout 1,2 title 'B1 passthrough, wrk keep-alive, non-stream completions (64p = 64 connections, ${THINK_MS} ms think time)'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8
set grid ytics
set key top left
set xlabel 'connections'
set yrange [0:*]
set title 'throughput'
set ylabel 'req/s'
plot '$BENCH_TMP/b1.dat' using 2:xtic(1) title 'direct', '' using 3 title 'nginx', '' using 4 title 'pdgw', '' using 5 title 'pdgw (libcurl legs)', '' using 6 title 'pdgw (libmicrohttpd front end)'
set title 'latency p99'
set ylabel 'ms'
plot '$BENCH_TMP/b1.dat' using 12:xtic(1) title 'direct', '' using 13 title 'nginx', '' using 14 title 'pdgw', '' using 15 title 'pdgw (libcurl legs)', '' using 16 title 'pdgw (libmicrohttpd front end)'
unset multiplot
GP
fi

get() { awk -F, -v l="$1@$2" -v col="$3" '$1 == l { print $col }' "$csv"; }
summary_begin b1_passthrough
for c in $CONNS; do
    ratio=$(awk -v a="$(get pdgw "$c" 4)" -v b="$(get nginx "$c" 4)" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
    add50=$(awk -v a="$(get pdgw "$c" 5)" -v b="$(get direct "$c" 5)" 'BEGIN { printf "%.3f", a - b }')
    add99=$(awk -v a="$(get pdgw "$c" 6)" -v b="$(get direct "$c" 6)" 'BEGIN { printf "%.3f", a - b }')
    ng99=$(awk -v a="$(get nginx "$c" 6)" -v b="$(get direct "$c" 6)" 'BEGIN { printf "%.3f", a - b }')
    cpur=$(awk -v a="$(get pdgw "$c" 8)" -v b="$(get nginx "$c" 8)" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
    if [[ "$c" == 1 ]]; then
        check_target b1 "c=1 latency pdgw adds over direct, p50" "$add50" le 1 ms
        continue
    fi
    if [[ "$c" == *p ]]; then
        check_target b1 "c=${c%p} paced (${THINK_MS} ms think) p99 pdgw adds" "$add99" le 1 ms
        echo "B1 c=$c: pdgw adds p50 $add50 ms; nginx adds p99 $ng99 ms over direct"
        continue
    fi
    # Targets (issue "Gateway core v2"): at 64 connections as many req/s as nginx with no
    # more proxy CPU per request.
    if [[ "$c" == 64 ]]; then
        check_target b1 "c=64 req/s pdgw/nginx" "$ratio" ge 1.0 x
        check_target b1 "c=64 proxy CPU per request pdgw/nginx" "$cpur" le 1.0 x
        check_target b1 "c=64 p99 pdgw adds over direct (saturated)" "$add99" le 1 ms
    else
        check_target b1 "c=$c req/s pdgw/nginx" "$ratio" ge 1.0 x
    fi
    echo "B1 c=$c: nginx adds p99 $ng99 ms over direct; pdgw/nginx CPU per request $cpur x"
done
# Legs on libcurl instead of pdgw's own client, against nginx and against pdgw as it ships.
for c in $CONNS; do
    [[ "$c" == *p || "$c" == 1 ]] && continue
    cr=$(awk -v a="$(get pdgwc "$c" 4)" -v b="$(get nginx "$c" 4)" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
    cc=$(awk -v a="$(get pdgwc "$c" 8)" -v b="$(get nginx "$c" 8)" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
    vr=$(awk -v a="$(get pdgw "$c" 4)" -v b="$(get pdgwc "$c" 4)" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
    vc=$(awk -v a="$(get pdgw "$c" 8)" -v b="$(get pdgwc "$c" 8)" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
    echo "B1 c=$c: libcurl legs/nginx req/s $cr x, CPU/req $cc x; own client/libcurl req/s $vr x, CPU/req $vc x"
    nr=$(awk -v a="$(get pdgwm "$c" 4)" -v b="$(get nginx "$c" 4)" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
    nc=$(awk -v a="$(get pdgwm "$c" 8)" -v b="$(get nginx "$c" 8)" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
    fc=$(awk -v a="$(get pdgw "$c" 8)" -v b="$(get pdgwm "$c" 8)" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
    echo "B1 c=$c: libmicrohttpd front end/nginx req/s $nr x, CPU/req $nc x; native/libmicrohttpd front end CPU/req $fc x"
done
echo "machine: $(machine_line)"
