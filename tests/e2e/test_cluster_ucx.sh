#!/usr/bin/env bash
# The UCX data plane (issue 40 section 5, docs/pd-protocol.md section 11):
# prefill and decode with --data-plane ucx move KV as sealed one-sided puts
# over UCX's tcp and then its shared-memory transports (UCX_TLS=tcp, sm).
# For each: 16 concurrent requests (greedy, seeded, streamed, stop strings,
# logprobs: js/same_tokens.mjs) must equal `kvseal serve`'s answers exactly,
# every request's KV must have come through UCX staging (decode's log), and
# after clients that leave mid-request (aborts during the transfer or the
# generation) every worker's pool is FREE and scrubbed. Then a UCX prefill
# worker and a TLS decode worker are never paired (the router keeps the
# request waiting rather than mixing planes).
. "$(dirname "$0")/lib.sh"
command -v node >/dev/null || skip "node is not installed (scripts/install-deps.sh installs it)"
ARGS=(-m "$KS_SRC/models/kjv-mini.gguf" --alias kjv-mini --ctx 512 --kv-pages 128 --threads 2)
start_server "$TMPD/serve.log" "${ARGS[@]}"
URL_A=$KS_URL; SERVE_PID=$KS_PID
ADM=adm-ucx-0123456789abcdef
long=$(printf 'And the LORD said unto Moses, %.0s' $(seq 1 25))
for tl in tcp sm; do
    PREFILL_ENV="UCX_TLS=$tl" DECODE_ENV="UCX_TLS=$tl" PREFILL_ARGS="--data-plane ucx" \
        DECODE_ARGS="--data-plane ucx" ROUTER_ARGS="--admin-key $ADM" \
        start_cluster "$TMPD/$tl" 1 1 "${ARGS[@]}"
    trap 'kill -KILL $SERVE_PID $KS_PID "${KS_PREFILL_PIDS[@]}" "${KS_DECODE_PIDS[@]}" 2>/dev/null; rm_tmpd' EXIT
    grep -q 'decode worker [0-9]* registered .*data plane ucx' "$TMPD/$tl.router" ||
        fail "$tl: the decode worker did not register on the UCX plane"
    URL_A=$URL_A URL_B=$KS_URL node "$(dirname "$0")/js/same_tokens.mjs" ||
        { tail -n 20 $KS_CLUSTER_LOGS >&2; fail "$tl: outputs differ from serve's"; }
    n=$(grep -c 'KV bytes opened from UCX staging' "$TMPD/$tl.decode1")
    [ "$n" -ge 17 ] || fail "$tl: only $n requests' KV came through UCX staging (17 expected)"
    grep -q 'pages come on the TLS link\|tag does not verify\|UCX record' $KS_CLUSTER_LOGS &&
        fail "$tl: a transfer left the UCX plane: $(grep -h 'TLS link\|does not verify\|UCX record' $KS_CLUSTER_LOGS | head -3)"
    # clients that leave at staggered times, some while their KV is in flight
    pids=()
    for i in $(seq 1 8); do
        curl -sS -N --max-time "0.0$i" "$KS_URL/v1/completions" -H 'Content-Type: application/json' \
            -d "{\"model\":\"kjv-mini\",\"prompt\":\"$i $long\",\"max_tokens\":64,\"temperature\":0,\"stream\":true}" \
            >/dev/null 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}" 2>/dev/null
    chk=$(curl -sS -H "Authorization: Bearer $ADM" "$KS_URL/admin/kv/check?timeout_ms=$((KS_WAIT_S * 1000))")
    expect_has "$tl: pools FREE and scrubbed after aborts" "$chk" '"clean":true'
    out=$(curl -sS "$KS_URL/v1/completions" -H 'Content-Type: application/json' \
        -d '{"model":"kjv-mini","prompt":"In the beginning","max_tokens":4,"temperature":0}')
    expect_has "$tl: still serving after the aborts" "$out" '"text"'
    echo "$tl: same tokens as serve over UCX ($n transfers sealed and verified), pools clean after aborts"
    stop_cluster
done
# a UCX prefill worker and a TLS decode worker: both register, but the router
# never pairs them (the request waits and times out in the queue); a UCX
# decode worker joining serves it
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMPD/secret"; chmod 600 "$TMPD/secret"
"$KS_BIN" router --host 127.0.0.1 --port 0 --cluster-port 0 --secret-file "$TMPD/secret" \
    --queue-timeout-ms 1500 "${ARGS[@]}" >"$TMPD/m.router.out" 2>"$TMPD/m.router" &
KS_PID=$!; KS_ROUTER_LOG=$TMPD/m.router; KS_CLUSTER_LOGS=$TMPD/m.router
wait_for "the router to come up" cluster__router_up
cport=$(sed -n 's/^cluster port \([0-9]*\).*/\1/p' "$TMPD/m.router.out" | head -1)
W=(--router 127.0.0.1:$cport --secret-file "$TMPD/secret" "${ARGS[@]}")
"$KS_BIN" decode "${W[@]}" >/dev/null 2>"$TMPD/m.decode1" & KS_DECODE_PIDS=($!)
UCX_TLS=tcp "$KS_BIN" prefill "${W[@]}" --data-plane ucx >/dev/null 2>"$TMPD/m.prefill1" & KS_PREFILL_PIDS=($!)
KS_CLUSTER_LOGS+=" $TMPD/m.decode1 $TMPD/m.prefill1"
KS_CLUSTER_WANT=2
wait_for "2 workers to register" cluster__registered
req "a request with no worker pair of one plane" 503 "$KS_URL/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"kjv-mini","prompt":"In the beginning","max_tokens":2,"temperature":0}'
UCX_TLS=tcp "$KS_BIN" decode "${W[@]}" --data-plane ucx >/dev/null 2>"$TMPD/m.decode2" & KS_DECODE_PIDS+=($!)
KS_CLUSTER_LOGS+=" $TMPD/m.decode2"
KS_CLUSTER_WANT=3
wait_for "the UCX decode worker to register" cluster__registered
wait_for "a UCX pair to serve" cluster__probe
file_has "$TMPD/m.decode2" "opened from UCX staging" || fail "the request did not go to the UCX decode worker"
stop_cluster
KS_PID=$SERVE_PID stop_server
echo "PASS"
