#!/usr/bin/env bash
# test_serve_slow_clients.sh — slow clients cannot starve the server (issue
# 8, defect 2). 300 connections trickle a request head one byte per second
# (a slowloris: far more than the old front's fixed 256 threads): while they
# are all still open, /health and a tenant's completion are answered (the
# HTTP front is event-driven, so idle connections cost little), and at the
# request deadline (--request-timeout) every slow one gets 408 and is
# closed. A per-address limit then caps one client's connections.
. "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl is not installed (scripts/install-deps.sh)"
M=$KS_SRC/models/kjv-mini.gguf
N=300
slow_head() { printf 'POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nX-Padding: %0100d\r\n\r\n' 0; }

start_server "$TMPD/s1.log" -m "$M" --alias kjv --request-timeout 20 --max-connections-per-ip 0
U=$KS_URL
rawc --conns $N --trickle-ms 1000 "${U##*:}" < <(slow_head) >"$TMPD/slow.out" &
SLOW=$!
wait_for "$N slow connections to be open" metric_ge "$U" kvseal_http_connections $N
t0=$SECONDS
code=$(curl -sS -m 10 -o "$TMPD/health" -w '%{http_code}' "$U/health") || fail "/health not answered while $N slow connections are open"
expect_eq "/health while saturated" "$code" 200
code=$(curl -sS -m 10 -o "$TMPD/c" -w '%{http_code}' "$U/v1/completions" \
    -d '{"model":"kjv","prompt":"In the beginning","max_tokens":8,"temperature":0}') ||
    fail "a completion was not answered while $N slow connections are open"
expect_eq "completion while saturated ($(cat "$TMPD/c"))" "$code" 200
expect_has "completion while saturated" "$(cat "$TMPD/c")" '"text":" of the Lord, and in the Lord'
# the answers came while every slow connection was still open (well before its deadline)
[ "$(metric "$U" kvseal_http_connections)" -ge $N ] || fail "the slow connections were closed before the answers"
echo "answered in $((SECONDS - t0)) s with $N slow connections open"
# the deadline closes them all with 408
wait_for "the slow clients to be closed" proc_gone $SLOW
wait $SLOW
expect_eq "how the slow connections ended" "$(cat "$TMPD/slow.out")" "408 $N, closed 0, other 0"
expect_eq "408s counted" "$(metric "$U" 'kvseal_rejections_total{reason="request_timeout"}')" $N
wait_for "the connections to be released (the one left is this query)" metric_is "$U" kvseal_http_connections 1
stop_server

# per-address limit: the 5th connection from one address is refused at once
start_server "$TMPD/s2.log" -m "$M" --request-timeout 3 --max-connections-per-ip 4
rawc --conns 6 --trickle-ms 200 "${KS_URL##*:}" < <(slow_head) >"$TMPD/limit.out"
expect_eq "per-address limit" "$(cat "$TMPD/limit.out")" "408 4, closed 2, other 0"
stop_server
echo "slow clients ok"
