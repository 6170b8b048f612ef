#!/usr/bin/env bash
# B1 passthrough overhead: wrk (keep-alive) non-streaming completions against
# (a) pdgw-sim directly, (b) nginx proxy_pass with upstream keep-alive to the same
# sim, (c) pdgw --protocol neutral to the same sim, in one run.
# Usage: b1_passthrough.sh [BIN_DIR]   env: DURATION (s, default 10), CONNS ("64 256")
source "$(dirname "$0")/lib.sh"
BIN_DIR=${1:-$BIN_DIR}
DURATION=${DURATION:-10}
CONNS=${CONNS:-"64 256"}
WORKERS=${WORKERS:-2}
need wrk nginx "$BIN_DIR/pdgw" "$BIN_DIR/pdgw-sim"
ulimit -n 65536 || true

sim_port=$(free_port)
nginx_port=$(free_port)
pdgw_port=$(free_port)

bench_start sim "$BIN_DIR/pdgw-sim" --role both --port "$sim_port" --zero-delay --max-tokens-default 16
wait_http "$sim_port" /health

mkdir -p "$BENCH_TMP/nginx"
cat >"$BENCH_TMP/nginx/nginx.conf" <<NGINX
worker_processes $WORKERS;
daemon off;
pid $BENCH_TMP/nginx/nginx.pid;
error_log $BENCH_TMP/nginx/error.log warn;
events { worker_connections 16384; }
http {
    access_log off;
    client_body_temp_path $BENCH_TMP/nginx/body;
    proxy_temp_path $BENCH_TMP/nginx/proxy;
    fastcgi_temp_path $BENCH_TMP/nginx/fcgi;
    uwsgi_temp_path $BENCH_TMP/nginx/uwsgi;
    scgi_temp_path $BENCH_TMP/nginx/scgi;
    upstream sim { server 127.0.0.1:$sim_port; keepalive 512; }
    server {
        listen 127.0.0.1:$nginx_port;
        location / {
            proxy_pass http://sim;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }
    }
}
NGINX
bench_start nginx nginx -c "$BENCH_TMP/nginx/nginx.conf" -p "$BENCH_TMP/nginx"
bench_start pdgw "$BIN_DIR/pdgw" --listen "127.0.0.1:$pdgw_port" --protocol neutral \
    --both "http://127.0.0.1:$sim_port" --workers "$WORKERS" --log-level warn --access-log false
wait_http "$pdgw_port" /ready
wait_http "$nginx_port" /health

cat >"$BENCH_TMP/post.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"sim-model","prompt":"The quick brown fox jumps over the lazy dog","max_tokens":16}'
LUA

# to_ms VALUE: wrk prints latencies as 812.00us / 1.23ms / 1.02s.
to_ms() {
    awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n *= 1; else if (v ~ /s$/) n *= 1000; printf "%.3f", n }'
}

csv=$RESULTS_DIR/b1_passthrough.csv
echo "target_conns,target,conns,req_per_s,p50_ms,p99_ms,non2xx" >"$csv"
declare -A RPS P50 P99
for c in $CONNS; do
    for target in direct:$sim_port nginx:$nginx_port pdgw:$pdgw_port; do
        name=${target%%:*}
        port=${target##*:}
        out=$(wrk -t 2 -c "$c" -d "${DURATION}s" --latency -s "$BENCH_TMP/post.lua" \
            "http://127.0.0.1:$port/v1/completions")
        rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
        p50=$(to_ms "$(awk '$1 == "50%" {print $2}' <<<"$out")")
        p99=$(to_ms "$(awk '$1 == "99%" {print $2}' <<<"$out")")
        non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
        echo "$name@$c,$name,$c,$rps,$p50,$p99,${non2xx:-0}" >>"$csv"
        RPS[$name@$c]=$rps
        P50[$name@$c]=$p50
        P99[$name@$c]=$p99
        printf 'B1 %-6s c=%-4s %10s req/s  p50 %8s ms  p99 %8s ms  non-2xx %s\n' \
            "$name" "$c" "$rps" "$p50" "$p99" "${non2xx:-0}"
    done
done
plot_bars "$csv" "$RESULTS_DIR/b1_passthrough.png" "B1 passthrough: req/s (wrk keep-alive)" "req/s" 1 4

summary=$RESULTS_DIR/b1_passthrough.summary
: >"$summary"
for c in $CONNS; do
    awk -v c="$c" -v pr="${RPS[pdgw@$c]}" -v nr="${RPS[nginx@$c]}" \
        -v p50="${P50[pdgw@$c]}" -v d50="${P50[direct@$c]}" \
        -v p99="${P99[pdgw@$c]}" -v d99="${P99[direct@$c]}" 'BEGIN {
        printf "B1 c=%s: pdgw/nginx req/s = %.2f; pdgw adds p50 %.3f ms, p99 %.3f ms over direct\n",
               c, pr / nr, p50 - d50, p99 - d99 }' | tee -a "$summary"
done
echo "machine: $(machine_line)" | tee -a "$summary"
