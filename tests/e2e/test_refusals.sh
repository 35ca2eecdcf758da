#!/usr/bin/env bash
# test_refusals.sh — one request contract (issue 8 section 5): every refusal
# reason of src/engine/admit.c a client can provoke, walked through
# `kvseal serve` and through a cluster (router + prefill + decode), each
# checked for its HTTP status, its OpenAI error code, and one more count of
# kvseal_rejections_total under the table's name. The answers must be the
# same on both fronts, wherever the refusal was made: in the HTTP front, in
# the engine's or the router's admission, or in the prefill worker, whose
# REJECT crosses the wire as a reason (before, an HTTP status rode in the
# frame and the router turned it back into an error code, losing it).
. "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || skip "curl is not installed (scripts/install-deps.sh)"
M=$KS_SRC/models/kjv-mini.gguf

cat >"$TMPD/tenants.json" <<'EOF'
{"admin_key": "sk-admin-0123456789",
 "tenants": [
  {"name": "acme", "keys": ["sk-acme"], "max_concurrent": 8, "tokens_per_minute": 10000000},
  {"name": "meter", "keys": ["sk-meter"], "max_concurrent": 8, "tokens_per_minute": 300}
 ]}
EOF
A=(-H "Authorization: Bearer sk-acme")
J=(-H "Content-Type: application/json")
LONG=$(printf 'And the LORD said unto Moses, %.0s' $(seq 12))  # ~90 tokens: 6 KV pages
MID=$(printf 'And the LORD said unto Moses, %.0s' $(seq 5))    # ~40 tokens: 3 KV pages
head -c 1100000 /dev/zero | tr '\0' 'a' | sed 's/^/{"model":"kjv","prompt":"/; s/$/"}/' >"$TMPD/huge.json"

# row REASON STATUS CODE CURL_ARGS... — one request refused for REASON: the
# status, the error code, and kvseal_rejections_total{reason=REASON} + 1
row() {
    local reason=$1 status=$2 code=$3; shift 3
    local m="kvseal_rejections_total{reason=\"$reason\"}" before after
    before=$(metric "$U" "$m")
    [ -n "$before" ] || fail "$FRONT: /metrics has no $m"
    req "$FRONT $reason" "$status" "$@"
    [ -z "$code" ] || expect_has "$FRONT $reason: code" "$BODY" "\"code\":\"$code\""
    after=$(metric "$U" "$m")
    expect_eq "$FRONT $reason: counted" "$after" $((before + 1))
    echo "$FRONT: $reason -> $status $code"
}

# The table: every reason a client can provoke on both fronts.
walk() {
    local C="$U/v1/completions"
    row context_length 400 context_length_exceeded "${A[@]}" "${J[@]}" "$C" \
        -d '{"model":"kjv","prompt":"In","max_tokens":600}'
    row invalid 400 invalid_parameter "${A[@]}" "${J[@]}" "$C" \
        -d '{"model":"kjv","prompt":"In","max_tokens":2,"temperature":-1}'
    row auth 401 invalid_api_key -H "Authorization: Bearer sk-nobody" "${J[@]}" "$C" \
        -d '{"model":"kjv","prompt":"In","max_tokens":2}'
    row tenant_rate 429 rate_limit_exceeded -H "Authorization: Bearer sk-meter" "${J[@]}" "$C" \
        -d '{"model":"kjv","prompt":"In","max_tokens":400}'
    row invalid_json 400 invalid_json "${A[@]}" "${J[@]}" "$C" -d '{"model":'
    row missing_parameter 400 missing_required_parameter "${A[@]}" "${J[@]}" "$C" -d '{"prompt":"In"}'
    row unsupported_parameter 400 unsupported_parameter "${A[@]}" "${J[@]}" "$C" \
        -d '{"model":"kjv","prompt":"In","suffix":"x"}'
    row model_not_found 404 model_not_found "${A[@]}" "${J[@]}" "$C" -d '{"model":"nope","prompt":"In"}'
    row too_large 413 request_too_large "${A[@]}" "${J[@]}" "$C" --data-binary @"$TMPD/huge.json"
    row unknown_url 404 unknown_url "${A[@]}" "$U/v2/completions"
    row method_not_allowed 405 method_not_allowed "${A[@]}" "$C"
    row bad_encoding 415 unsupported_content_encoding "${A[@]}" "${J[@]}" -H "Content-Encoding: br" "$C" \
        -d '{"model":"kjv","prompt":"In"}'
    row invalid_path 400 invalid_path "${A[@]}" "${J[@]}" --path-as-is "$U/v1%2Fcompletions" -d '{}'
    # Workers AI numbers its errors (the table's documented code)
    row too_large 413 "" "${A[@]}" "${J[@]}" "$U/accounts/a/ai/run/kjv" --data-binary @"$TMPD/huge.json"
    expect_has "$FRONT too_large: Workers AI code" "$BODY" '"code":3006'
    # offline last: the model comes back online after it
    req "$FRONT offline" 200 -X POST -H "Authorization: Bearer sk-admin-0123456789" "$U/admin/models/kjv/offline"
    row offline 503 model_offline "${A[@]}" "${J[@]}" "$C" -d '{"model":"kjv","prompt":"In","max_tokens":2}'
    req "$FRONT online" 200 -X POST -H "Authorization: Bearer sk-admin-0123456789" "$U/admin/models/kjv/online"
    req "$FRONT served again" 200 "${A[@]}" "${J[@]}" "$C" -d '{"model":"kjv","prompt":"In","max_tokens":2}'
}

# serve (a pool smaller than one context is refused at start, I8, so the
# engine's kv_capacity cannot be provoked here)
FRONT=serve
start_server "$TMPD/s" -m "$M" --alias kjv --tenants "$TMPD/tenants.json"
U=$KS_URL
walk
stop_server

# the cluster: the router advertises a 64-token context, which the decode
# worker's pool holds exactly (4 KV pages: a smaller pool is refused at
# registration, issue 40), and the prefill worker a 32-token context. So a
# ~90-token prompt is refused by the router's admission, and a ~40-token
# prompt passes the router and decode but not prefill, whose REJECT crosses
# the wire with its reason.
FRONT=cluster
ROUTER_ARGS="--alias kjv --tenants $TMPD/tenants.json --ctx 64" CLUSTER_PROBE_AUTH=sk-acme \
    DECODE_ARGS="--ctx 64 --kv-pages 4" PREFILL_ARGS="--ctx 32 --kv-pages 2" \
    start_cluster "$TMPD/c" 1 1 -m "$M"
U=$KS_URL
walk
row context_length 400 context_length_exceeded "${A[@]}" "${J[@]}" "$U/v1/completions" \
    -d "{\"model\":\"kjv\",\"prompt\":\"$LONG\",\"max_tokens\":2}"
expect_has "cluster context_length at the router: says why" "$BODY" "maximum context length is 64 tokens"
row context_length 400 context_length_exceeded "${A[@]}" "${J[@]}" "$U/v1/completions" \
    -d "{\"model\":\"kjv\",\"prompt\":\"$MID\",\"max_tokens\":2}"
expect_has "cluster context_length at prefill: its message" "$BODY" "maximum context length is 32 tokens"
file_has "$TMPD/c.prefill1" "rejected: context_length" || fail "the refusal was not the prefill worker's"
stop_cluster
echo "refusals ok"
