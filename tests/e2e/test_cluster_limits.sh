#!/usr/bin/env bash
# Tenant limits across the fleet (issue 40, section 2): two routers share
# one tenant's tokens_per_minute through redis (--limits-redis). A client
# spreads requests over both routers until both answer 429: the tokens
# admitted in all (usage.total_tokens of the 200s; each request uses all it
# reserved) are within 10% of the limit — plus what the bucket refilled
# meanwhile (L * seconds / 60; a loaded machine stretches the run) — where
# two per-router buckets would have admitted twice it. Then redis goes away: the routers log it,
# /metrics says so (kvseal_limits_redis_up 0), and they admit from their
# local share (--limits-local-share) instead of failing.
# LIMITS_ARGS overrides the routers' redis options (LIMITS_ARGS=" " runs
# the same traffic with per-router buckets: the check then fails).
. "$(dirname "$0")/lib.sh"
command -v redis-server >/dev/null ||
    skip "redis-server is not installed (Debian: apt-get install redis-server, or scripts/install-deps.sh)"
command -v redis-cli >/dev/null || skip "redis-cli is not installed (Debian: redis-tools)"
L=3000
KEY=sk-acme-0123456789abcdef PROBE=sk-probe-0123456789abcdef
cat >"$TMPD/tenants.json" <<EOF
{"tenants":[{"name":"acme","keys":["$KEY"],"tokens_per_minute":$L},
            {"name":"probe","keys":["$PROBE"]}]}
EOF
# redis on a free port (the first of a few random ones that binds)
for try in 1 2 3 4 5; do
    RPORT=$((20000 + RANDOM % 30000))
    redis-server --port $RPORT --bind 127.0.0.1 --save '' --appendonly no >"$TMPD/redis.log" 2>&1 &
    RPID=$!
    redis_up() { [ "$(redis-cli -p $RPORT ping 2>/dev/null)" = PONG ] || { kill -0 $RPID 2>/dev/null || return 2; return 1; }; }
    end=$((SECONDS + KS_WAIT_S))
    while :; do redis_up; rc=$?; [ $rc = 1 ] && [ $SECONDS -lt $end ] && { sleep 0.05; continue; }; break; done
    [ $rc = 0 ] && break
    kill $RPID 2>/dev/null; wait $RPID 2>/dev/null
done
[ "$rc" = 0 ] || { cat "$TMPD/redis.log" >&2; fail "redis-server did not start"; }
LIMITS_ARGS=${LIMITS_ARGS:---limits-redis 127.0.0.1:$RPORT --limits-redis-prefix kvseal-test: --limits-local-share 0.5}
ARGS=(-m "$KS_SRC/models/kjv-mini.gguf" --ctx 512 --kv-pages 96 --threads 1)
CLUSTER_PROBE_AUTH=$PROBE KS_ROUTERS=2 ROUTER_ARGS="--tenants $TMPD/tenants.json $LIMITS_ARGS" \
    start_cluster "$TMPD/c" 1 1 "${ARGS[@]}"
trap 'kill -KILL "${KS_ROUTER_PIDS[@]}" "${KS_PREFILL_PIDS[@]}" "${KS_DECODE_PIDS[@]}" $RPID 2>/dev/null; rm_tmpd' EXIT

# ~60 prompt tokens and 1 generated: a request uses exactly what it reserves
prompt="And the LORD spake unto Moses, saying, Speak unto the children of Israel, and say unto them, \
When any man of you bring an offering unto the LORD, ye shall bring your offering of the cattle, \
even of the herd, and of the flock."
body='{"model":"kjv-mini","prompt":"'"$prompt"'","max_tokens":1,"temperature":0}'
# in waves of 8 concurrent requests, 4 per router, until both routers refuse
# in one wave: the shared bucket is empty
one() {  # one ROUTER_INDEX OUT: a request, its status in OUT.code and body in OUT
    curl -sS -o "$2" -w '%{http_code}' "${KS_URLS[$1]}/v1/completions" \
        -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' -d "$body" >"$2.code" 2>"$2.err"
}
admitted=0 n200=(0 0) n429=(0 0) waves=0 t0=$(date +%s.%N)
while :; do
    waves=$((waves + 1)); [ $waves -le 50 ] || fail "no wave of 429s after 50 waves (admitted $admitted tokens)"
    pids=()
    for j in 0 1 2 3 4 5 6 7; do one $((j % 2)) "$TMPD/w$j" & pids+=($!); done
    wait "${pids[@]}"
    w429=(0 0)
    for j in 0 1 2 3 4 5 6 7; do
        r=$((j % 2)) code=$(cat "$TMPD/w$j.code")
        case $code in
        200) admitted=$((admitted + $(jq -r '.usage.total_tokens' "$TMPD/w$j"))); n200[$r]=$((n200[r] + 1)) ;;
        429) n429[$r]=$((n429[r] + 1)) w429[$r]=1
             grep -q "tenant 'acme' exceeded its limit of $L tokens per minute" "$TMPD/w$j" ||
                 fail "a 429 without the tenant's message: $(cat "$TMPD/w$j")" ;;
        *) fail "via router $((r + 1)): status $code: $(cat "$TMPD/w$j" "$TMPD/w$j.err")" ;;
        esac
    done
    [ ${w429[0]} = 1 ] && [ ${w429[1]} = 1 ] && break
done
t=$(echo "$(date +%s.%N) - $t0" | bc -l)
# the limit is a rate: over t seconds the bucket refills by L * t / 60 on top of its L
allowed=$(echo "$L + $L * $t / 60" | bc -l)
printf 'admitted %d tokens in %.2f s, allowed %.0f (limit %d/min; router 1: %d ok / %d 429, router 2: %d ok / %d 429)\n' \
    $admitted "$t" "$allowed" $L ${n200[0]} ${n429[0]} ${n200[1]} ${n429[1]} >&2
[ "${n200[0]}" -gt 0 ] && [ "${n200[1]}" -gt 0 ] || fail "one router admitted nothing"
echo "$admitted >= 0.9 * $allowed && $admitted <= 1.1 * $allowed" | bc -l | grep -qx 1 ||
    fail "admitted $admitted tokens over two routers, want within 10% of $(printf %.0f "$allowed")"

# redis gone: each router falls back to its local share, says so, and serves
kill $RPID; wait $RPID 2>/dev/null
code=$(curl -sS -o "$TMPD/b" -w '%{http_code}' "${KS_URLS[0]}/v1/completions" \
    -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' -d "$body")
expect_eq "a request while redis is down ($(cat "$TMPD/b"))" "$code" 200
wait_for "router 1 to report redis down" metric_is "${KS_URLS[0]}" kvseal_limits_redis_up 0
metric_ge "${KS_URLS[0]}" kvseal_limits_redis_errors_total 1 || fail "no redis error counted"
grep -q 'limits: redis 127.0.0.1:'$RPORT' unreachable' "$TMPD/c.router" || fail "router 1 did not log the outage"
stop_cluster
echo PASS
