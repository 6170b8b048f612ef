#!/usr/bin/env bash
# What libmicrohttpd alone costs, against B1's target (pdgw's CPU per proxied request <= 1.0 x
# nginx's). wrk (keep-alive, 64 connections) posts B1's completion request to:
#   nginx        proxy_pass with upstream keep-alive to a pdgw-sim, as in B1;
#   pdgw         pdgw --protocol neutral to the same sim, as in B1 (its own HTTP/1.x server);
#   pdgw-mhd     the same with --frontend mhd (libmicrohttpd in front);
#   mhd-direct   mhd-floor: libmicrohttpd in pdgw's mode reading the body and answering a fixed
#                completion from the access handler (no upstream, no parsing, no metrics);
#   mhd-suspend  the same, suspended at the end of the body and resumed on the next loop turn,
#                as pdgw does for every proxied request;
#   nginx-static nginx answering the same completion itself (`return 200`): nginx's own floor;
#   epoll-later  epoll-floor: a bare edge-triggered epoll loop answering the same completion on
#                the loop's next turn, as mhd-suspend does: what a front end of pdgw's own would
#                spend in the same mode (its sockets stay in the epoll set);
#   epoll-direct the same answering at once.
# Rounds alternate the order. The figure is CPU time per request of the server's processes
# (from /proc), as ratios to nginx's proxying: if mhd-suspend's floor, which leaves out the
# upstream half of the work, is already near nginx's whole proxy, no gateway on
# libmicrohttpd in this mode reaches 1.0 x; epoll-later against mhd-suspend is what that mode
# costs libmicrohttpd and would not cost a loop of pdgw's own.
# Usage: mhd_floor.sh [BIN_DIR]   env: DURATION (s per run, 5), ROUNDS (4), WORKERS (2)
source "$(dirname "$0")/lib.sh"
BIN_DIR=${1:-$BIN_DIR}
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-4}
WORKERS=${WORKERS:-2}
need wrk nginx curl "$BIN_DIR/pdgw" "$BIN_DIR/pdgw-sim" "$BIN_DIR/mhd-floor" "$BIN_DIR/epoll-floor"
raise_nofile >/dev/null

sim_port=$(free_port)
targets="nginx pdgw pdgw-mhd mhd-suspend mhd-direct nginx-static epoll-later epoll-direct"
declare -A port pid
for t in $targets; do port[$t]=$(free_port); done
reply='{"id":"cmpl-0","object":"text_completion","created":1700000000,"model":"sim-model","choices":[{"index":0,"text":" a b c d e f g h i j k l m n o p","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":6,"completion_tokens":16,"total_tokens":22}}'

bench_start sim "$BIN_DIR/pdgw-sim" --role both --port "$sim_port" --zero-delay \
    --max-tokens-default 16 --record-capacity 0 --max-batch 4096
wait_http "$sim_port" /health
nginx_start "$WORKERS" 16384 "$(nginx_proxy_block "$sim_port" "${port[nginx]}" 512)
    server {
        listen 127.0.0.1:${port[nginx-static]};
        location / {
            default_type application/json;
            return 200 '$reply';
        }
    }"
pid[nginx]=$LAST_PID
bench_start pdgw "$BIN_DIR/pdgw" --listen "127.0.0.1:${port[pdgw]}" --protocol neutral \
    --both "http://127.0.0.1:$sim_port" --workers "$WORKERS" --log-level warn --no-access-log
pid[pdgw]=$LAST_PID
bench_start pdgw-mhd "$BIN_DIR/pdgw" --listen "127.0.0.1:${port[pdgw-mhd]}" \
    --protocol neutral --both "http://127.0.0.1:$sim_port" --workers "$WORKERS" \
    --log-level warn --no-access-log --frontend mhd
pid[pdgw-mhd]=$LAST_PID
# start_floor NAME TOOL MODE: one of the floor servers on its port.
start_floor() {
    bench_start "$1" "$BIN_DIR/$2" --port "${port[$1]}" --workers "$WORKERS" --mode "$3"
    pid[$1]=$LAST_PID
}
start_floor mhd-direct mhd-floor direct
start_floor mhd-suspend mhd-floor suspend
start_floor epoll-later epoll-floor later
start_floor epoll-direct epoll-floor direct
wait_http "${port[nginx]}" /health
wait_http "${port[pdgw]}" /ready
wait_http "${port[pdgw-mhd]}" /ready
for t in nginx-static mhd-direct mhd-suspend epoll-later epoll-direct; do
    wait_http "${port[$t]}" /
done

cat >"$BENCH_TMP/post.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"sim-model","prompt":"The quick brown fox jumps over the lazy dog","max_tokens":16}'
LUA

# pids_of TARGET: its processes (nginx's master and workers serve both nginx targets).
pids_of() {
    case $1 in
    nginx | nginx-static) echo "${pid[nginx]} $(pgrep -P "${pid[nginx]}" | tr '\n' ' ')" ;;
    *) echo "${pid[$1]}" ;;
    esac
}

# proc_user_sys_s PID...: user and system CPU seconds of the processes, on one line.
proc_user_sys_s() {
    local pid u=0 k=0 a b
    for pid in "$@"; do
        read -r a b < <(awk '{ sub(/^.*\) /, ""); print $12, $13 }' "/proc/$pid/stat" 2>/dev/null ||
            echo 0 0)
        u=$((u + ${a:-0}))
        k=$((k + ${b:-0}))
    done
    awk -v u="$u" -v k="$k" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.3f %.3f\n", u / hz, k / hz }'
}

raw=$BENCH_TMP/raw.csv
: >"$raw"
echo "mhd-floor load before: $(load_avg)"
for ((r = 0; r < ROUNDS; r++)); do
    order=$targets
    ((r % 2 == 1)) && order=$(tr ' ' '\n' <<<"$targets" | tac | tr '\n' ' ')
    for name in $order; do
        pids=$(pids_of "$name")
        read -r u0 k0 < <(proc_user_sys_s $pids)
        out=$(wrk -t 2 -c 64 -d "${DURATION}s" -s "$BENCH_TMP/post.lua" \
            "http://127.0.0.1:${port[$name]}/v1/completions")
        read -r u1 k1 < <(proc_user_sys_s $pids)
        rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
        total=$(awk '/requests in/ {print $1}' <<<"$out")
        non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
        read -r user_us sys_us < <(awk -v u0="$u0" -v u1="$u1" -v k0="$k0" -v k1="$k1" \
            -v n="${total:-0}" 'BEGIN { if (n == 0) n = -1e99
                printf "%.1f %.1f\n", (u1 - u0) / n * 1e6, (k1 - k0) / n * 1e6 }')
        cpu_us=$(awk -v u="$user_us" -v k="$sys_us" 'BEGIN { printf "%.1f", u + k }')
        echo "$name,$r,$rps,$cpu_us,${non2xx:-0},$(load_avg | cut -d' ' -f1),$user_us,$sys_us" >>"$raw"
        printf 'mhd-floor %-12s round %d %10s req/s  cpu %6s us/req (user %s, system %s)  non-2xx %s\n' \
            "$name" "$r" "$rps" "$cpu_us" "$user_us" "$sys_us" "${non2xx:-0}"
    done
done

csv=$RESULTS_DIR/mhd_floor.csv
echo "target,req_per_s,cpu_us_per_req,user_us_per_req,sys_us_per_req,cpu_vs_nginx_proxy,non2xx,load1" >"$csv"
awk -F, '{ if (!($1 in n)) order[++m] = $1; n[$1]++; rps[$1] += $3; cpu[$1] += $4;
    bad[$1] += $5; load[$1] += $6; usr[$1] += $7; sys[$1] += $8 }
    END { base = cpu["nginx"] / n["nginx"];
        for (i = 1; i <= m; i++) { k = order[i];
            printf "%s,%.0f,%.1f,%.1f,%.1f,%.2f,%d,%.2f\n", k, rps[k] / n[k], cpu[k] / n[k],
                usr[k] / n[k], sys[k] / n[k], (base > 0 ? cpu[k] / n[k] / base : 0), bad[k],
                load[k] / n[k] } }' "$raw" >>"$csv"
column -s, -t "$csv"
